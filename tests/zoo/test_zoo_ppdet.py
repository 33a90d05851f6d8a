"""The CI subset of the PaddleDetection zoo (bench/zoo_ppdet.py), on the tree's own code: one config per neck family
built by ppdet's ``load_config`` + ``create`` from PaddleDetection's source tree and scanned at O1 and O2 on a batch
of the config's own TrainReader, and 3 steps of the tree's ``tools/train.py --amp`` for PicoDet (one of the models
PaddleX refuses AMP for) under ``ampsafe run --emulate-fp16``, read from report.json.

Everything runs in children whose ``PYTHONPATH`` puts the source tree ahead of an installed paddledet (and the
zoo's shim: imgaug's ``numpy.sctypes`` under NumPy 2, ppdet's per-step losses as JSON lines).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ampsafe.patches.registry import INNER_LINKS
from bench.zoo_ppdet import BATCH, K, child_env, overlay, run_group, tree, write_coco
from bench.zoo_ppdet_data import run_folder
from bench.zoo_ppdet_table import neck_status

if not (tree() / "tools" / "train.py").is_file():
    pytest.skip(
        f"needs the PaddleDetection source tree at {tree()} (set PPDET_SRC or AMPSAFE_SHARED)", allow_module_level=True
    )
pytest.importorskip("paddle")

SIZE = 160
# one config per neck family, each the smallest model of its family
NECKS = {
    "FPN": "gfl/gfl_r18vd_1x_coco.yml",
    "CustomCSPPAN": "ppyoloe/ppyoloe_plus_crn_t_auxhead_300e_coco.yml",
    "HybridEncoder": "rtdetr/rtdetr_r18vd_6x_coco.yml",
    "LCPAN": "picodet/picodet_xs_320_coco_lcnet.yml",
    "YOLOCSPPAN": "yolox/yolox_nano_300e_coco.yml",
}
TRAIN_CONFIG = "picodet/picodet_xs_320_coco_lcnet.yml"
STEPS = 3


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """Each neck family's config built and scanned, in one child (ppdet's registry cleaned between configs)."""
    work = tmp_path_factory.mktemp("zoo-ppdet")
    data = write_coco(work / "coco", 2, size=SIZE)
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "suite", str(tree() / "configs"), str(work), str(data)]
    proc = subprocess.run(
        [*cmd, str(SIZE), *NECKS.values()], env=child_env(work), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((work / "suite.json").read_text())
    return {r["config"]: r for r in results}


@pytest.mark.parametrize("neck", list(NECKS))
def test_neck_family_builds_and_scans_at_both_levels(scanned, neck):
    r = scanned[NECKS[neck]]
    assert r["built"] and r["why_not"] is None, r
    assert r["neck"] == neck and r["built_neck"] == neck, r  # the merged config's neck is the one ppdet built
    for level in ("O1", "O2"):
        s = r["scan"][level]
        assert "error" not in s, s
        assert s["input"] == f"1x3x{SIZE}x{SIZE}", s  # one image of the config's own transforms at SIZE
        assert s["neck_paths"] > 0, s  # the trace went through the neck
        # at random init, on this input, no neck path is within the scan's margin of float16's range
        assert s["neck_risky"] == 0, s
        assert s["least_headroom"] is not None and s["least_headroom"] > 0, s
    status = neck_status(neck)
    # the registry's word on the neck holds on what the scan measures (an already-safe neck measured with inner
    # links, RT-DETR's HybridEncoder, has unnormalized paths that end inside it)
    if status.startswith("already safe") and INNER_LINKS not in status:
        assert r["scan"]["O1"]["neck_unnormalized"] == 0, (status, r["scan"]["O1"])
    elif status.startswith("safe variant"):
        assert r["scan"]["O1"]["neck_unnormalized"] > 0, (status, r["scan"]["O1"])


def test_picodet_tools_train_amp_runs_under_ampsafe_run_with_its_scaler(tmp_path):
    data = write_coco(tmp_path / "coco", STEPS, size=SIZE)
    out = tmp_path / "record.json"
    subprocess.run(
        [sys.executable, "-m", "bench.zoo_ppdet_worker", "record", str(tree() / "configs"), TRAIN_CONFIG, str(out)],
        env=child_env(tmp_path), capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    record = json.loads(out.read_text())
    config = overlay(record, data, tmp_path / "run", size=SIZE, batch=1)
    env = child_env(tmp_path)
    env["AMPSAFE_ZOO_STEPLOG"] = str(tmp_path / "steps.jsonl")
    report = tmp_path / "report"
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--report", str(report), "--",
           sys.executable, "tools/train.py", "-c", str(config), "--amp", "--enable_ce", "True", "-o", "epoch=1"]  # fmt: skip
    code, log = run_group(cmd, timeout=600, env=env, cwd=tree())
    assert code == 0, log[-3000:]
    summary = json.loads((report / "report.json").read_text())
    (scaler,) = [s for s in summary["scalers"] if s["total_steps"]]
    # ppdet's Trainer built ampsafe's scaler, enabled under the emulation, and every step went through it
    assert scaler["class"] == "ampsafe.paddle.scaler.GradScaler" and scaler["disabled_reason"] is None, scaler
    assert scaler["total_steps"] == STEPS and len(scaler["steps"]) == STEPS, scaler
    assert scaler["on_floor"] == "heal"
    overflowed = [row[0] for row in scaler["steps"] if row[2]]
    assert scaler["overflow_steps"] == len(overflowed)
    # each heal islanded named modules of the model
    assert all(h["paths"] for h in scaler["heal_records"]), scaler["heal_records"]
    losses = [
        json.loads(line)["loss"] for line in (tmp_path / "steps.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "stats"
    ]  # fmt: skip
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), losses


def _record(config: str, out, cwd):
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "record", str(tree() / "configs"), config, str(out)]
    return subprocess.run(cmd, env=child_env(out.parent), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_blazeface_config_loads_in_the_run_folder_the_sweep_runs_ppdet_in(tmp_path):
    """configs/datasets/wider_face.yml's WIDERFaceValDataset asserts its four ground-truth .mat files when the config
    loads: the tree's BlazeFace config does not load in an empty folder, and loads in :func:`run_folder`."""
    bare = tmp_path / "bare"
    bare.mkdir()
    proc = _record("face_detection/blazeface_1000e.yml", tmp_path / "bare.json", bare)
    assert proc.returncode != 0 and "wider_face_val.mat not exist" in proc.stderr, proc.stderr[-2000:]
    proc = _record("face_detection/blazeface_1000e.yml", tmp_path / "run.json", run_folder(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "run.json").read_text())
    assert (record["architecture"], record["train_dataset"]["name"]) == ("BlazeFace", "WIDERFaceDataSet"), record


def test_semi_supervised_overlay_feeds_the_trees_semi_reader_with_labeled_and_unlabeled_data(tmp_path):
    """ARSL's config (``ssod_method``, no TrainReader): the overlay gives ppdet's SemiTrainReader its own transforms at
    the sweep's size and batch, an UnsupTrainDataset of unlabeled images, and a TrainReader of the labeled view; the
    merged config, loaded by ppdet in a child, builds both datasets on the synthetic files."""
    config = "semi_det/arsl/arsl_fcos_r50_fpn_coco_full.yml"
    proc = _record(config, tmp_path / "record.json", run_folder(tmp_path / "cwd"))
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
        [sys.executable, "-c", code, str(path)], env=child_env(tmp_path), cwd=run_folder(tmp_path / "cwd"),
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
