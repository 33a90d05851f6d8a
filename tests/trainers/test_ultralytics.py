"""ultralytics' own trainer under ``ampsafe run``: ``--watch`` resolves the ``DetectionModel`` the trainer calls
(not its inner ``nn.Sequential``) and its checkpoints (``deepcopy`` of the EMA, ``torch.save``) are written; a
NaN batch is skipped by the FP32 guard; ``--emulate-fp16`` with ``amp=True`` trains in float16 with ampsafe's
scaler, and a forward overflow is healed instead of raising."""

from __future__ import annotations

import pytest
from trainer_helpers import ampsafe_run, needs

needs("ultralytics")
pytestmark = pytest.mark.slow


def test_watch_saves_checkpoints_and_guards_the_called_detection_model():
    proc = ampsafe_run("--watch", script="train_yolo.py", script_args=["--nan-step", "-1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoints: best.pt,last.pt" in proc.stdout, proc.stdout
    assert "guarding the optimizer steps of DetectionModel (FP32 guard)" in proc.stderr, proc.stderr[-3000:]


def test_nan_batch_is_skipped_and_parameters_stay_finite():
    proc = ampsafe_run(script="train_yolo.py", script_args=["--nan-step", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, parameters finite: True" in proc.stdout, proc.stdout
    assert "step 2: non-finite loss or gradients, step skipped" in proc.stderr


def test_amp_under_emulate_fp16_heals_a_forward_overflow_instead_of_raising():
    proc = ampsafe_run(
        "--emulate-fp16",
        "--min-scale",
        "8192",
        script="train_yolo.py",
        script_args=["--amp", "--overflow", "--epochs", "4"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--emulate-fp16 [ultralytics]: check_amp passes for a model on a CPU" in proc.stderr
    assert "LossScaleFloorError" not in proc.stderr
    assert "ampsafe heal at step" in proc.stderr and "scale restored to 65536.0" in proc.stderr
    out = proc.stdout
    assert "parameters finite: True, buffers finite: True, amp: True, scaler: ampsafe.auto.GradScaler" in out, out
    assert "checkpoints: best.pt,last.pt" in out
