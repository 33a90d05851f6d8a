"""PaddleOCR's own, unmodified ``tools/train.py -c configs/rec/rec_svtrnet.yml`` (SVTR: STN_ON + SVTRNet +
CTCHead, CTCLoss, AdamW; ``shared/upstream/PaddleOCR-src`` or ``$PADDLEOCR_SRC``) on synthetic text lines at
PaddleOCR's default level O2, float16 emulated on the CPU: native (Paddle's GradScaler) against
``ampsafe run --emulate-fp16``, the first steps of bench/results/ppocr_rec_optin.md's lr 0.002 recipe.

Nothing overflows, and ``ampsafe run`` leaves the run alone: ampsafe's scaler, the same loss at every step, scale
kept, no heal (the SVTR Local mixers' ``-inf`` masks are no event). The stress recipe (lr 0.02, 72 steps: native's
CTCLoss NaN from step 24, ampsafe heals stage 2) is the bench's (``python -m bench.ppocr_rec_optin``), minutes long.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LEVEL = "O2"  # PaddleOCR's tools/train.py default amp_level
STEPS = 6  # the first steps of the bench's one-epoch run (the same batches)
_results: dict = {}


@pytest.fixture(scope="module")
def work(paddleocr_src, tmp_path_factory):
    from bench.ppocr_rec_optin import write_dataset

    root = tmp_path_factory.mktemp("ppocr-rec")
    write_dataset(root / "data")
    return root


def _run(src: Path, work: Path, run: str) -> dict:
    from bench.ppocr_rec_optin import run_one

    if run not in _results:
        _results[run] = run_one(src, work, run, LEVEL, data=work / "data", stop_after=STEPS)
    result = _results[run]
    assert result["returncode"] == 0 and result["steps"] == STEPS, result["log_tail"]
    for step in result["per_step"]:  # the step log's loss is the one PaddleOCR printed (log_smooth_window=1)
        if step["log_loss"] is not None and step["loss"] == step["loss"]:
            assert step["loss"] == pytest.approx(step["log_loss"], rel=1e-5, abs=1e-5)
    return result


def test_native_run_uses_paddles_scaler_and_does_not_overflow(paddleocr_src, work):
    r = _run(paddleocr_src, work, "native")
    assert r["scaler_class"] == "paddle.amp.grad_scaler.GradScaler"
    assert r["overflowing_steps"] == 0 and r["final_scale"] == 1024.0, r["overflow_at"]


def test_ampsafe_run_leaves_a_run_without_overflow_alone(paddleocr_src, work):
    native, ours = _run(paddleocr_src, work, "native"), _run(paddleocr_src, work, "ampsafe")
    assert ours["scaler_class"].startswith("ampsafe."), ours["scaler_class"]
    assert ours["overflowing_steps"] == 0 and ours["heals"] == 0 and ours["final_scale"] == native["final_scale"]
    assert [s["loss"] for s in ours["per_step"]] == pytest.approx([s["loss"] for s in native["per_step"]], rel=1e-4)
