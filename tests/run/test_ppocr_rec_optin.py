"""Opt-in (``PADDLEOCR_SRC=/path/to/PaddleOCR``): PaddleOCR's own, unmodified ``tools/train.py -c
configs/rec/rec_svtrnet.yml`` (SVTR: STN_ON + SVTRNet + CTCHead, CTCLoss, AdamW) on synthetic text lines at
PaddleOCR's default level O2, float16 emulated on the CPU, native against ``ampsafe run --emulate-fp16``.

What it asserts is what was measured (bench/results/ppocr_rec_optin.md):

* lr 0.002, one epoch: nothing overflows, and ``ampsafe run`` leaves the run alone (the same loss at every step,
  scale kept, no heal; the SVTR Local mixers' ``-inf`` masks are no event);
* lr 0.02, three epochs (the stress recipe): the unnormalized stage-2 residual stream drives
  ``backbone.sub_sample2.conv`` past 65504 (66,590 here) after 24 steps; native's loss is NaN from then on
  (PaddleOCR issue #6632's ``CTCLoss: nan``) and its scale collapses; ``ampsafe run`` heals at the floor, names
  the stage-2 paths and trains on at its starting scale.

The harness (dataset, command lines, step log) is ``bench/ppocr_rec_optin.py``; each run takes one to five
minutes on two cores. Needs PaddleOCR's runtime packages (scikit-image, imgaug, lmdb, rapidfuzz).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SRC = os.environ.get("PADDLEOCR_SRC")
pytestmark = [
    pytest.mark.skipif(not SRC, reason="set PADDLEOCR_SRC to a PaddleOCR source checkout to run"),
    pytest.mark.slow,
]

from bench.ppocr_rec_optin import CONFIG, LR, STEPS  # noqa: E402

LEVEL = "O2"  # PaddleOCR's tools/train.py default amp_level
STRESS = {"lr": 0.02, "epochs": 3}
_results: dict = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    if not (Path(SRC) / "tools" / "train.py").is_file() or not (Path(SRC) / CONFIG).is_file():
        pytest.fail(f"PADDLEOCR_SRC={SRC} is not a PaddleOCR checkout (no tools/train.py, {CONFIG})")
    from bench.ppocr_rec_optin import write_dataset

    root = tmp_path_factory.mktemp("ppocr-rec-optin")
    write_dataset(root / "data")
    return root


def _run(work: Path, run: str, lr: float = LR, epochs: int = 1) -> dict:
    from bench.ppocr_rec_optin import run_one

    key = (run, lr, epochs)
    if key not in _results:
        _results[key] = run_one(Path(SRC), work, run, LEVEL, data=work / "data", lr=lr, epochs=epochs)
    result = _results[key]
    assert result["returncode"] == 0, result["log_tail"]
    assert result["steps"] == STEPS * epochs, result["log_tail"]
    for step in result["per_step"]:  # the step log's loss is the one PaddleOCR printed (log_smooth_window=1)
        if step["log_loss"] is not None and step["loss"] == step["loss"]:
            assert step["loss"] == pytest.approx(step["log_loss"], rel=1e-5, abs=1e-5)
    return result


def test_native_run_uses_paddles_scaler_and_learns(work):
    r = _run(work, "native")
    assert r["scaler_class"] == "paddle.amp.grad_scaler.GradScaler"
    assert r["final_loss"] < r["first_loss"]


def test_ampsafe_run_leaves_a_run_without_overflow_alone(work):
    native, ours = _run(work, "native"), _run(work, "ampsafe")
    assert native["overflowing_steps"] == 0, native["overflow_at"]
    assert ours["scaler_class"].startswith("ampsafe."), ours["scaler_class"]
    assert ours["overflowing_steps"] == 0 and ours["heals"] == 0 and ours["final_scale"] == native["final_scale"]
    assert [s["loss"] for s in ours["per_step"]] == pytest.approx([s["loss"] for s in native["per_step"]], rel=1e-4)


@pytest.mark.trajectory
def test_stress_recipe_native_loss_goes_nan_and_its_scale_collapses(work):
    r = _run(work, "native", **STRESS)
    assert r["overflowing_steps"] >= 10, r["overflow_at"]
    assert r["final_scale"] < 1e-2, (r["final_scale"], r["overflow_at"])
    assert r["final_loss"] != r["final_loss"], r["final_loss"]  # NaN: PaddleOCR's "CTCLoss: nan"


@pytest.mark.trajectory
def test_stress_recipe_ampsafe_run_heals_the_stage2_overflow_and_trains_on(work):
    native, ours = _run(work, "native", **STRESS), _run(work, "ampsafe", **STRESS)
    assert ours["heals"] >= 1 and ours["heal_log"], ours["log_tail"]
    assert "backbone.sub_sample2.conv" in ours["heal_log"][0], ours["heal_log"]
    assert ours["final_scale"] >= 2**5 * native["final_scale"] and ours["final_scale"] >= 256
    assert ours["final_loss"] == ours["final_loss"] and ours["final_loss"] < ours["first_loss"]
