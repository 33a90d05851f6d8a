"""Seed 004 on torchvision's own detection reference: ``references/detection/train.py`` and ``engine.py``,
unmodified, under ``ampsafe run``, on a tiny synthetic COCO-layout dataset (CPU, no AMP).

The reference stops itself on a non-finite loss (``Loss is nan, stopping training`` then ``sys.exit(1)`` in
``train_one_epoch``) while its model is a local of ``main()``. One NaN image in the batch of step 0 or step 1
(after one optimizer step): the run keeps the status 1, and the summary and the report name the sample (the image
index in that batch), the op, the pass and ``kind='input'``; the report's permanent fix speaks of the data.

The test environment gives the reference what its start-up needs and nothing of ampsafe: a ``sitecustomize`` on
the child's ``PYTHONPATH`` (``ampsafe run`` chains to it) registers ``torch._six`` (``coco_eval.py`` imports it;
torch 2 removed it) and, with ``NAN_BATCH=B:I``, makes image ``I`` of the ``B``-th batch the loader fetches all
NaN, as a corrupt file decoded into NaN would be (``train.py`` seeds nothing, so the images' order is random; the
position in the loader's order is what the run can name).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from run_helpers import ampsafe_run  # tests/run/run_helpers.py

# tests/conftest.py sets AMPSAFE_SHARED (default: the shared/ folder beside the checkout)
SHARED = Path(os.environ.get("AMPSAFE_SHARED", Path(__file__).resolve().parents[3] / "shared"))
REFERENCE = SHARED / "upstream" / "torchvision-references" / "detection"
pytestmark = pytest.mark.skipif(
    not (REFERENCE / "train.py").is_file(),
    reason=f"torchvision's detection reference not found at {REFERENCE} (set AMPSAFE_SHARED to the shared/ folder)",
)

SITECUSTOMIZE = '''\
"""The test environment of torchvision's detection reference (not ampsafe)."""
import os
import sys
import types

_six = types.ModuleType("torch._six")  # coco_eval.py imports it; torch 2 removed it
_six.string_classes = (str, bytes)
sys.modules.setdefault("torch._six", _six)

if os.environ.get("NAN_BATCH"):
    import torch
    from torch.utils.data import Subset

    _batch, _image = map(int, os.environ["NAN_BATCH"].split(":"))
    _fetched = [0]
    _getitems = Subset.__getitems__

    def __getitems__(self, indices):
        # the training set is a Subset (images without annotations removed); the loader fetches a batch at once
        samples = _getitems(self, indices)
        if _fetched[0] == _batch:
            image, target = samples[_image]
            samples[_image] = (torch.full_like(image, float("nan")), target)
        _fetched[0] += 1
        return samples

    Subset.__getitems__ = __getitems__
'''


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> Path:
    """Six 96x96 noise JPEGs (one aspect-ratio group: batches in the loader's order) with two boxes each, in the
    COCO layout ``train.py --dataset coco`` reads, and the test environment's ``sitecustomize``."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("coco")
    rng = np.random.default_rng(0)
    (root / "annotations").mkdir()
    for split, n in (("train", 6), ("val", 2)):
        folder = root / f"{split}2017"
        folder.mkdir()
        images, annotations = [], []
        for i in range(n):
            name = f"{i:012d}.jpg"
            Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(folder / name)
            images.append({"id": i + 1, "file_name": name, "width": 96, "height": 96})
            for k, (x, y, w, h) in enumerate(((8, 10, 40, 30), (50, 44, 30, 40))):
                polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": i + 1,
                        "category_id": k + 1,
                        "bbox": [x, y, w, h],
                        "area": w * h,
                        "iscrowd": 0,
                        "segmentation": [polygon],
                    }
                )
        categories = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
        data = {"images": images, "annotations": annotations, "categories": categories}
        (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(data))
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return root


def _train(coco: Path, tmp_path: Path, nan_batch: str, *options: str):
    env = {
        **os.environ,
        "NAN_BATCH": nan_batch,
        "PYTHONPATH": os.pathsep.join(p for p in (str(coco / "site"), os.environ.get("PYTHONPATH", "")) if p),
    }
    command = [
        sys.executable, str(REFERENCE / "train.py"), "--data-path", str(coco), "--dataset", "coco",
        "--model", "fasterrcnn_mobilenet_v3_large_320_fpn", "--device", "cpu", "--epochs", "1", "-b", "2",
        "--workers", "0", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    start = time.time()
    proc = ampsafe_run(*options, "--report", str(tmp_path / "report"), "--", *command, env=env, cwd=tmp_path)
    print(f"ampsafe run {' '.join(options)} NAN_BATCH={nan_batch}: {time.time() - start:.1f} s")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(
    "nan_batch, options",
    [("1:0", ()), ("0:1", ()), ("1:1", ("--watch",)), ("0:0", ("--watch",))],
    ids=["step1", "step0", "step1-watch", "step0-watch"],
)
def test_a_nan_image_is_named_by_its_batch_and_index_and_the_reference_keeps_its_exit_status(
    coco, tmp_path, nan_batch, options
):
    step, image = map(int, nan_batch.split(":"))
    proc = _train(coco, tmp_path, nan_batch, *options)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the reference's own sys.exit(1)
    assert "Loss is nan, stopping training" in proc.stdout
    summary = re.search(
        rf"the script stopped itself; forward pass of step {step}: (\S+):(\w+), sample {image} .*kind='input'"
        rf".*; bad data: sample {image} of the batch of step {step}",
        proc.stdout,
    )
    assert summary is not None, proc.stdout[-3000:]
    module, op = summary.groups()
    assert "sys.exit(1) at engine.py" in proc.stdout  # what ended it, after what caused it
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    origin = next(g["exit_origin"] for g in data["guards"] if g.get("exit_origin"))
    assert (origin["phase"], origin["module"], origin["op"]) == ("forward", module, op)
    assert (origin["kind"], origin["step"], origin["sample"]) == ("input", step, image)
    markdown = (tmp_path / "report" / "report.md").read_text()
    happened, fix = markdown.split("## Make the fix permanent")
    assert f"sample {image}" in happened and "kind='input'" in happened
    assert f"{step + 1} batches checked" in happened  # the replay's forward is not one of the script's batches
    assert f"sample {image} of the batch of step {step}" in fix and "fix or drop it" in fix
    assert "swap-neck" not in fix and "ampsafe.patch(" not in fix  # data, not the model
    assert "sys.exit" not in fix and "Nothing to change" not in fix
