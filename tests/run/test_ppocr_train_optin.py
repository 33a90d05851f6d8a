"""Opt-in (``PADDLEOCR_SRC=/path/to/PaddleOCR``): PaddleOCR's own, unmodified ``tools/train.py -c
configs/det/det_mv3_db.yml`` for 30 steps at O1 and O2 (Adam lr 0.01, random init, 160 px, batch 4, Paddle
GradScaler from 1024 with dynamic scaling, 120 synthetic text images), float16 emulated on the CPU:

* native (only ``ampsafe.paddle.amp_emulation.install()``): Paddle's scaler decays, overflow after overflow;
* ``ampsafe run --emulate-fp16`` (default options, ``--on-floor heal``): heals, ends at a scale of >= 256;
* ``ampsafe swap-neck configs/det/det_mv3_db.yml -o safe.yml`` under ``ampsafe run --emulate-fp16``: no overflow.

The harness (dataset, the imgaug / step-log shim, the command lines) is ``bench/ppocr_optin.py``; each run takes
a few minutes on two cores. Needs PaddleOCR's runtime packages (scikit-image, imgaug, lmdb, rapidfuzz).
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

STEPS = 30  # 120 images, batch 4, one epoch
_results: dict = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    if not (Path(SRC) / "tools" / "train.py").is_file() or not (Path(SRC) / "configs/det/det_mv3_db.yml").is_file():
        pytest.fail(f"PADDLEOCR_SRC={SRC} is not a PaddleOCR checkout (no tools/train.py, configs/det/det_mv3_db.yml)")
    from bench.ppocr_optin import write_dataset

    root = tmp_path_factory.mktemp("ppocr-optin")
    write_dataset(root / "data", count=STEPS * 4, size=160)
    return root


def _run(work: Path, run: str, level: str) -> dict:
    from bench.ppocr_optin import run_one

    key = (run, level)
    if key not in _results:
        _results[key] = run_one(Path(SRC), work, run, level, data=work / "data")
    result = _results[key]
    assert result["returncode"] == 0, result["log_tail"]
    assert result["steps"] == STEPS, result["log_tail"]
    # the step log's loss is the one PaddleOCR printed (log_smooth_window=1)
    for step in result["per_step"]:
        if step["log_loss"] is not None and step["loss"] == step["loss"]:
            assert step["loss"] == pytest.approx(step["log_loss"], rel=1e-5, abs=1e-5)
    return result


# Measured gaps (bench/results/ppocr_optin.md), kept visible instead of tuning the recipe until they pass:
_O1_NATIVE = pytest.mark.xfail(
    reason="borderline at 30 steps: O1 overflows from step 10-13 and Paddle halves the scale once per overflow "
    "from 1024, and 1e-2 takes 17 halvings; measured 19 overflows / 0.00195 in one run and 16 / 0.0156 in another "
    "(float16 rounding differs between emulator versions)",
    strict=False,
)
_O2_HEAL = pytest.mark.xfail(
    reason="at the floor the scaler replays the batch with the block's amp_emulation BlockEmulator, which passes "
    "every op through outside its own auto_cast block, so the replay runs in float32, finds nothing and raises; "
    "with that passed (diagnostic) the replay names head:exp, but heal islands modules and still raises",
    strict=False,
)
_O2_SWAPPED = pytest.mark.xfail(
    reason="O2's overflow is DBHead's step-function exp (float16 at O2 only), not the neck that swap-neck replaces",
    strict=True,
)


@pytest.mark.parametrize("level", [pytest.param("O1", marks=_O1_NATIVE), "O2"])
def test_native_paddle_scaler_decays(work, level):
    r = _run(work, "native", level)
    assert r["scaler_class"] == "paddle.amp.grad_scaler.GradScaler"
    assert r["overflowing_steps"] >= 10, r["overflow_at"]
    assert r["final_scale"] < 1e-2, (r["final_scale"], r["overflow_at"])


@pytest.mark.parametrize("level", ["O1", pytest.param("O2", marks=_O2_HEAL)])
def test_ampsafe_run_heals(work, level):
    r = _run(work, "ampsafe", level)
    assert r["scaler_class"].startswith("ampsafe."), r["scaler_class"]
    assert r["heals"] >= 1, r["log_tail"]
    assert r["final_scale"] >= 256, (r["final_scale"], r["overflow_at"])


@pytest.mark.parametrize("level", ["O1", pytest.param("O2", marks=_O2_SWAPPED)])
def test_swapped_config_does_not_overflow(work, level):
    r = _run(work, "swapped", level)
    assert r["scaler_class"].startswith("ampsafe."), r["scaler_class"]
    assert r["overflowing_steps"] == 0, r["overflow_at"]


def test_swapped_config_with_exp_in_float32_does_not_overflow_at_O2(work):
    """O2's fix: the swapped neck plus PaddleOCR's own ``Global.amp_custom_black_list=['exp']`` for DBHead."""
    r = _run(work, "swapped_black_exp", "O2")
    assert r["scaler_class"].startswith("ampsafe."), r["scaler_class"]
    assert r["overflowing_steps"] == 0, r["overflow_at"]
    assert r["final_scale"] >= 1024
