"""The report's lines fit how the run ended (issue 31, item 8): a neck swap is offered only when float16
overflowed (never for a clean run, an FP32 run or bad data), a scaler's data steps are advice about the data,
and an FP32 guard's ``--watch`` stop says what it measured, with no placeholder origin (``<loss>:loss``)."""

from __future__ import annotations

import sys

from run_helpers import SCRIPTS, ampsafe_run, stepped_scaler  # tests/run/run_helpers.py

from ampsafe.run.report import format_summary, permanent_fix, to_markdown

CONFIG = "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"  # its FPN has a safe counterpart


def _scaler(**counts) -> dict:
    return {"class": "ampsafe.torch.scaler.GradScaler", "framework": "torch", "total_steps": 6, **counts}


DATA_STEPS = _scaler(
    skipped_steps=2,
    input_steps=2,
    scale=1024.0,
    steps=[[i, 1024.0, False, False] for i in range(6)],
    bad_inputs=[
        {"step": 2, "where": "args[0]['img'][3]", "sample": 3, "scale": 1024.0},
        {"step": 4, "where": "args[0]['img'][0]", "sample": 0, "scale": 1024.0},
    ],
)
FP32_NAN_IMAGE = {
    "guards": [
        {
            "framework": "torch",
            "total_steps": 1,
            "exit_origin": {"step": 1, "phase": "forward", "module": "transform", "op": "sub", "kind": "input"},
        }
    ],
    "ended": {"exit": 1, "where": "engine.py:43"},
}


def test_no_neck_swap_for_a_clean_run_an_fp32_nan_image_or_a_scalers_bad_data(upstream):
    config = upstream / CONFIG
    for summary in ({"scalers": [_scaler(scale=65536.0)]}, FP32_NAN_IMAGE, {"scalers": [DATA_STEPS]}):
        fix = permanent_fix(summary, config=config, command=["python", "train.py", "-c", str(config)])
        assert fix.swap_neck is None, summary
        assert "swap-neck" not in to_markdown(summary, fix, plot=None)
    overflowed = {"scalers": [_scaler(overflow_steps=3, skipped_steps=3, scale=8192.0)]}
    assert permanent_fix(overflowed, config=config).swap_neck.applicable


def test_a_scalers_data_steps_are_advice_about_the_data_not_an_island():
    fix = permanent_fix({"scalers": [DATA_STEPS]})
    (advice,) = fix.advice
    assert "2 step(s) had a non-finite value in the model's input" in advice and "(steps 2, 4)" in advice
    assert "The first: args[0]['img'][3] of the batch of step 2 (sample 3)" in advice
    assert "no island, no neck swap" in advice and fix.patch is None
    summary = format_summary([{"pid": 5, "scalers": [DATA_STEPS]}])
    assert "0 floor hits, 0 heals, final scale 1024.0; 2 skipped for a non-finite input" in summary
    assert "overflowing" not in summary  # data steps are not overflows
    assert "Nothing to change" not in to_markdown({"scalers": [DATA_STEPS]}, fix, plot=None)


def test_fp32_watch_stop_on_a_backward_nan_says_what_was_measured(tmp_path):
    proc = ampsafe_run(
        "--watch", "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_fp32_backward_nan.py")
    )
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.NonFiniteError"))
    assert "<loss>" not in error and ":loss" not in error
    assert (
        "optimizer step 2 skipped by ampsafe run's FP32 guard: its forward, replayed under ampsafe.watch, is " in error
    )
    assert "the loss is finite and gradients are not: the backward pass went non-finite" in error
    assert "non-finite gradients: 0.weight" in error
    markdown = (tmp_path / "report.md").read_text()
    assert "<loss>:loss" not in markdown and "the backward pass went non-finite" in markdown
    assert "swap-neck" not in markdown


def test_a_nan_input_under_amp_at_step_0_is_data_too(tmp_path):
    # the scaler finds its model at its first step, after step 0's forward; the run's guard hooked the model when
    # the optimizer was built, so step 0's NaN is told from an overflow as well
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_torch.py"), "--nan-step", "0",
        "--steps", "4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, scale 65536.0" in proc.stdout
    scaler = stepped_scaler(tmp_path)  # step 0 skipped for its data, the scale kept: not an overflow
    (bad,) = scaler.bad_inputs
    assert bad.step == 0 and bad.where.startswith("args[0][4]"), bad
    assert scaler.scale == 65536.0 and scaler.input_steps == 1, scaler
    assert scaler.overflow_steps == 0 and scaler.skipped_at == [], scaler
