"""ultralytics' own trainer, ``amp=True`` emulated in float16, one NaN pixel in the batch of step 2: data, never a
float16 overflow (issue 31, item 4). Before: ``step 2: backward overflow ... routine`` under ``--watch``, the
scale halved, and both reports advised islanding 64 paths. Now the scaler skips the step with the scale kept,
``--watch`` stops naming the input (kind='input'), and the report's fix is the data: no island, no neck swap."""

from __future__ import annotations

import pytest
from trainer_helpers import ampsafe_run, needs, stepped_scaler

needs("ultralytics")
pytestmark = pytest.mark.slow


def test_nan_pixel_under_amp_is_named_as_input_and_the_scale_is_kept(tmp_path):
    report = tmp_path / "rep"
    proc = ampsafe_run(
        "--watch",
        "--emulate-fp16",
        "--report",
        str(report),
        script="train_yolo.py",
        script_args=["--amp", "--nan-step", "2", "--epochs", "2"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, err = proc.stdout, proc.stderr
    assert "routine" not in out + err.replace("routine loss-scale backoffs are counted", "")
    # --watch stops at the step and names the input, as it does in FP32
    stopped = next(line for line in out.splitlines() if line.startswith("script: training stopped: NonFiniteError"))
    assert "at step 2 in sample 0 [args[0]['img'][0]]: kind='input'" in stopped
    assert "scale: 65536.0" in out and "parameters finite: True, buffers finite: True" in out
    scaler = stepped_scaler(report)  # one step skipped for its data, the scale kept: no overflow, no heal
    (bad,) = scaler.bad_inputs
    assert (bad.step, bad.sample) == (2, 0) and bad.where.startswith("args[0]['img'][0]"), bad
    assert scaler.scale == 65536.0 and scaler.input_steps == 1 and not scaler.overflow_steps, scaler
    assert (scaler.floor_hits, scaler.heals) == (0, 0), scaler
    markdown = (report / "report.md").read_text()
    fix = markdown.split("## Make the fix permanent", 1)[1]
    assert "bad data, not a float16 overflow" in fix and "sample 0" in fix
    assert "ampsafe.patch(" not in fix and "swap-neck" not in fix and "Nothing to change" not in fix
