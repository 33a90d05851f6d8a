"""The PaddleDetection zoo's overlay on the tree's own configs (bench/zoo_ppdet.py): the folder every ppdet child
runs in, the semi-supervised readers and datasets, and the resizes nested in a transform. Children run with the
source tree ahead of an installed paddledet on ``PYTHONPATH`` (``child_env``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.zoo_ppdet import BATCH, K, child_env, overlay, tree, write_coco
from bench.zoo_ppdet_data import child_cwd

if not (tree() / "tools" / "train.py").is_file():
    pytest.skip(
        f"needs the PaddleDetection source tree at {tree()} (set PPDET_SRC or AMPSAFE_SHARED)", allow_module_level=True
    )
pytest.importorskip("paddle")

SIZE = 160


def _record(config: str, out, cwd):
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "record", str(tree() / "configs"), config, str(out)]
    return subprocess.run(cmd, env=child_env(out.parent), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_blazeface_config_loads_in_the_folder_the_sweep_runs_ppdet_in(tmp_path):
    """configs/datasets/wider_face.yml's WIDERFaceValDataset asserts its four ground-truth .mat files when the config
    loads: the tree's BlazeFace config does not load in an empty folder, and loads in :func:`child_cwd`."""
    bare = tmp_path / "bare"
    bare.mkdir()
    proc = _record("face_detection/blazeface_1000e.yml", tmp_path / "bare.json", bare)
    assert proc.returncode != 0 and "wider_face_val.mat not exist" in proc.stderr, proc.stderr[-2000:]
    proc = _record("face_detection/blazeface_1000e.yml", tmp_path / "run.json", child_cwd(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "run.json").read_text())
    assert (record["architecture"], record["train_dataset"]["name"]) == ("BlazeFace", "WIDERFaceDataSet"), record


def test_semi_supervised_overlay_feeds_the_trees_semi_reader_with_labeled_and_unlabeled_data(tmp_path):
    """ARSL's config (``ssod_method``, no TrainReader): the overlay gives ppdet's SemiTrainReader its own transforms at
    the sweep's size and batch, an UnsupTrainDataset of unlabeled images, and a TrainReader of the labeled view; the
    merged config, loaded by ppdet in a child, builds both datasets on the synthetic files."""
    config = "semi_det/arsl/arsl_fcos_r50_fpn_coco_full.yml"
    proc = _record(config, tmp_path / "record.json", child_cwd(tmp_path / "cwd"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["semi_train_reader"] and record["train_reader"] is None, record
    path = overlay(record, write_coco(tmp_path / "coco", 4, size=SIZE), tmp_path / "run", size=SIZE, batch=1)
    code = (
        "import sys, json; from ppdet.core.workspace import load_config, create; cfg = load_config(sys.argv[1]); "
        "semi, view = cfg['SemiTrainReader'], cfg['TrainReader']; "
        "sup, unsup = create('TrainDataset')(), create('UnsupTrainDataset'); sup.parse_dataset(); unsup.parse_dataset(); "
        "print(json.dumps({'sizes': [semi['sup_batch_size'], semi['unsup_batch_size'], view['batch_size']], "
        "'resize': [op for op in semi['sample_transforms'] if 'RandomResize' in op], "
        "'view': [next(iter(op)) for op in view['sample_transforms']], "
        "'records': [len(sup.roidbs), len(unsup.roidbs)], 'labels': ['gt_bbox' in sup.roidbs[0], 'gt_bbox' in unsup.roidbs[0]], "
        "'same_images': [r['im_file'] for r in sup.roidbs] == [r['im_file'] for r in unsup.roidbs]}))"
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=child_env(tmp_path), cwd=child_cwd(tmp_path / "cwd"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["sizes"] == [1, 1, 1], got
    (resize,) = got["resize"]
    assert resize["RandomResize"]["target_size"] == [[SIZE, SIZE]] * len(resize["RandomResize"]["target_size"]), got
    assert got["view"][0] == "Decode" and "NormalizeImage" in got["view"], got  # sample transforms, then the weak view
    # the labeled and the unlabeled dataset read the same synthetic images, boxes for the labeled one only
    assert got["records"] == [K * BATCH] * 2 and got["same_images"] and got["labels"] == [True, False], got


def test_shrink_reaches_the_resizes_nested_in_dino_random_select():
    """DINO's TrainReader (configs/dino/_base_/dino_reader.yml) resizes inside ``RandomSelect``'s two branches: the
    sweep's overlay sets those to its size too, so DETR-family rows train at the size every other row does."""
    import yaml

    from bench.zoo_ppdet import SIZE, shrink

    reader = yaml.safe_load((tree() / "configs" / "dino" / "_base_" / "dino_reader.yml").read_text())["TrainReader"]
    shrunk = [shrink(op) for op in reader["sample_transforms"]]
    (select,) = [op["RandomSelect"] for op in shrunk if "RandomSelect" in op]
    resizes = [args for branch in select.values() for op in branch for name, args in op.items() if "Resize" in name]
    assert len(resizes) == 3, select  # one in the first branch, two in the second
    assert all(r["short_side_sizes"] == [SIZE] and r["max_size"] == SIZE for r in resizes), select
    (crop,) = [op["RandomSizeCrop"] for op in select["transforms2"] if "RandomSizeCrop" in op]
    assert crop["max_size"] <= SIZE, crop
