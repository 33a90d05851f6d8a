"""``ampsafe run`` guards FP32 scripts: a non-finite step is skipped and counted; ``--watch`` names its origin."""

from __future__ import annotations

import sys

import pytest
from run_helpers import (
    SCRIPTS,
    ampsafe_run,
    guard_record,
    only_scaler,
    run_summary,
    stepped_scaler,
)  # tests/run/run_helpers.py


def test_nan_batch_is_skipped_and_parameters_stay_finite(tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path / "rep"), "--", sys.executable, str(SCRIPTS / "train_fp32_nan.py"), "--nan-step", "3"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, parameters finite: True, optimizer state finite: True" in proc.stdout
    assert "the script created no GradScaler; its optimizer steps were guarded" in proc.stdout
    guard = guard_record(tmp_path / "rep")
    assert (guard.model, guard.total_steps, guard.skipped_at) == ("Sequential", 6, (3,)), guard
    assert "nothing to report" not in proc.stdout


def test_watch_stops_at_the_nan_step_naming_sample_and_kind_input():
    proc = ampsafe_run(
        "--watch", "--", sys.executable, str(SCRIPTS / "train_fp32_nan.py"), "--nan-step", "3", "--nan-sample", "5"
    )
    assert proc.returncode == 1
    assert "NonFiniteError" in proc.stderr
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.NonFiniteError"))
    assert "kind='input'" in error and "in sample 5" in error and "at step 3" in error
    assert "forward pass" in error and "0:linear" in error  # the op and module that read the NaN input
    assert "script: done" not in proc.stdout


def test_more_than_max_skips_in_a_row_stop_the_run_with_advice():
    proc = ampsafe_run("--max-skips", "0", "--", sys.executable, str(SCRIPTS / "train_fp32_nan.py"), "--nan-step", "1")
    assert proc.returncode == 1
    assert "SkippedStepsError" in proc.stderr and "--max-skips K" in proc.stderr and "--watch" in proc.stderr


@pytest.mark.parametrize("optimizer", ["adam"])
def test_skipped_step_leaves_adam_state_untouched(optimizer, tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path), "--",
        sys.executable, str(SCRIPTS / "train_fp32_nan.py"), "--nan-step", "0", "--optimizer", optimizer,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parameters finite: True, optimizer state finite: True" in proc.stdout
    guard = guard_record(tmp_path)
    assert (guard.total_steps, guard.skipped_at) == (6, (0,)), guard


def test_scaler_steps_are_not_guarded_twice(tmp_path):
    proc = ampsafe_run(
        "--on-floor", "clamp", "--report", str(tmp_path), "--",
        sys.executable, str(SCRIPTS / "train_torch.py"), "--poison", "--init-scale", "8", "--steps", "6",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    scaler = only_scaler(tmp_path)  # the scaler's own counts, unchanged
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits) == (6, 6, 3), scaler
    summary = run_summary(tmp_path)  # none of its optimizer steps went through the guard
    assert not any(g.total_steps for g in summary.guards), summary.guards


def test_disabled_cuda_scaler_on_cpu_says_so_and_the_guard_takes_over(tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_cuda_scaler.py"), "--nan-step", "2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the summary line a user reads says why the scaler did nothing (not "0 steps, 0 skipped")
    assert "ampsafe.torch.scaler.GradScaler: disabled (CUDA not available)" in proc.stdout
    scaler = only_scaler(tmp_path)
    assert scaler.disabled_reason == "disabled (CUDA not available)" and scaler.total_steps == 0, scaler
    guard = guard_record(tmp_path)
    assert (guard.model, guard.total_steps, guard.skipped_at) == ("Sequential", 4, (2,)), guard
    assert "parameters finite: True" in proc.stdout


def test_script_disabled_scaler_is_reported_as_disabled_by_the_script(tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path), "--",
        sys.executable, str(SCRIPTS / "train_torch.py"), "--cuda-namespace", "--steps", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    scaler = only_scaler(tmp_path)
    assert scaler.disabled_reason == "disabled by the script (enabled=False)" and not scaler.total_steps, scaler


def test_emulate_fp16_makes_the_cuda_scaler_scale_on_a_cpu(tmp_path):
    proc = ampsafe_run(
        "--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_cuda_scaler.py")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scaler enabled True" in proc.stdout
    scaler = stepped_scaler(tmp_path)
    assert scaler.class_name == "ampsafe.torch.scaler.GradScaler" and scaler.disabled_reason is None, scaler
    assert (scaler.total_steps, scaler.skipped_steps) == (4, 0), scaler
    assert not any(g.total_steps for g in run_summary(tmp_path).guards)  # no step went through the FP32 guard


@pytest.mark.parametrize("how", ["step", "minimize"])
def test_paddle_nan_batch_is_skipped_through_step_and_minimize(how, tmp_path):
    extra = ["--minimize"] if how == "minimize" else []
    proc = ampsafe_run(
        "--report", str(tmp_path), "--",
        sys.executable, str(SCRIPTS / "train_paddle_fp32_nan.py"), "--nan-step", "2", *extra,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, parameters finite: True" in proc.stdout
    guard = guard_record(tmp_path)
    assert (guard.framework, guard.model, guard.total_steps, guard.skipped_at) == ("paddle", "Sequential", 5, (2,))


def test_paddle_watch_names_the_sample_and_kind_input():
    proc = ampsafe_run("--watch", "--", sys.executable, str(SCRIPTS / "train_paddle_fp32_nan.py"), "--nan-step", "2")
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.NonFiniteError"))
    assert "kind='input'" in error and "in sample 3" in error and "at step 2" in error


def test_watch_with_a_scaler_numbers_steps_as_the_scaler_does():
    # the watch is armed at the first scale(loss), after step 0's forward: its passes still count from step 0
    proc = ampsafe_run("--watch", "--", sys.executable, str(SCRIPTS / "train_torch.py"), "--nan-step", "3")
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.NonFiniteError"))
    assert "at step 3 in sample 4" in error and "kind='input'" in error
