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
from bench.zoo_ppdet import child_env, overlay, run_group, tree, write_coco
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
