"""ultralytics' own trainer under ``ampsafe run``: under ``--watch`` the FP32 guard guards the ``DetectionModel``
the trainer calls (not its inner ``nn.Sequential``), the checkpoints (``deepcopy`` of the EMA, ``torch.save``)
are written, and a NaN batch is skipped with parameters and buffers finite, then named by the watch;
``--emulate-fp16`` with ``amp=True`` trains in float16 with ampsafe's scaler, and a forward overflow is healed
instead of raising, also when the trainer's NaN recovery reloads the scale from ``last.pt`` every epoch.

The overflow here is put in by the script (``--overflow`` multiplies the first conv's weight), not grown by
training as in the other frameworks' tests (``growth.py``): every conv of an ultralytics model is followed by a
BatchNorm and its detection loss saturates, so no few-step CPU run of it grows a layer past 65504."""

from __future__ import annotations

import re

import pytest
from trainer_helpers import ampsafe_run, emulated_run, guard_record, needs, patch_line, stepped_scaler

needs("ultralytics")
pytestmark = pytest.mark.slow


def test_watch_guards_the_detection_model_saves_checkpoints_and_a_nan_batch_is_skipped(tmp_path):
    # two steps per epoch: the checkpoints of epoch 1 are written under --watch; the NaN batch is step 2
    args = ["--nan-step", "2", "--epochs", "2"]
    proc = ampsafe_run("--watch", "--report", str(tmp_path), script="train_yolo.py", script_args=args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "guarding the optimizer steps of DetectionModel (FP32 guard)" in proc.stderr, proc.stderr[-3000:]
    guard = guard_record(tmp_path)
    assert (guard.model, guard.total_steps, guard.skipped_at) == ("DetectionModel", 3, (2,)), guard
    # --watch stops the run at the first skip and names where the NaN came from: the batch, at the first conv
    assert "script: training stopped: NonFiniteError: first non-finite value of the forward pass comes from " in out
    assert "model.0.conv:conv2d" in out and "kind='input'" in out, out
    assert "script: done, parameters finite: True, buffers finite: True" in out, out
    assert "checkpoints: best.pt,last.pt" in out, out


def test_amp_under_emulate_fp16_heals_a_forward_overflow_instead_of_raising(tmp_path):
    report = tmp_path / "rep"
    proc = emulated_run(report, "train_yolo.py", ["--amp", "--overflow", "--epochs", "4"], min_scale=8192)
    assert "--emulate-fp16 [ultralytics]: check_amp passes for a model on a CPU" in proc.stderr
    assert "LossScaleFloorError" not in proc.stderr
    scaler = stepped_scaler(report)
    assert scaler.heal_records and scaler.heal_records[0].scale_after == 65536.0, scaler.heal_records
    out = proc.stdout
    assert "parameters finite: True, buffers finite: True, amp: True, scaler: ampsafe.auto.GradScaler" in out, out
    assert "checkpoints: best.pt,last.pt" in out
    line = patch_line((report / "report.md").read_text())
    paths = re.findall(r'"([^"]*)"', line.split("paths=", 1)[1])
    assert "" not in paths, line  # the loss DetectionModel computes itself reads model.*: those are islanded
    _apply_to_a_fresh_yolo_model(line, paths)


def test_a_checkpoint_reload_each_epoch_still_heals_from_the_runs_records(tmp_path):
    # 8 images, 4 steps an epoch: the scale falls 65536 -> 256 by the end of epoch 1, and ultralytics' NaN recovery
    # reloads last.pt (scale 4096) after every NaN epoch, so the floor (1.0) never comes; 17 overflowing steps in a
    # row (the 16 halvings to the floor, and the floor hit) heal as the floor would have
    args = ["--amp", "--overflow", "--epochs", "6", "--train-images", "8"]
    proc = ampsafe_run("--emulate-fp16", "--report", str(tmp_path / "rep"), script="train_yolo.py", script_args=args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scaler = stepped_scaler(tmp_path / "rep")
    # the reload the floor never survives
    assert any((r.scale_before, r.scale_after) == (256.0, 4096.0) for r in scaler.reloads), scaler.reloads
    # step 16 is the 17th overflowing step in a row: healed there by the run's records, not at the floor
    assert [row[0] for row in scaler.steps if row[2]][:17] == list(range(17)), scaler.steps
    (heal,) = scaler.heal_records
    assert heal.step == 16 and "model.0.conv" in heal.paths and scaler.floor_hits == 0, scaler
    out = proc.stdout
    assert "NaN persisted" not in out + proc.stderr
    assert "parameters finite: True, buffers finite: True, amp: True" in out, out


def _apply_to_a_fresh_yolo_model(line: str, paths: list[str]) -> None:
    """The printed line on ``YOLO("yolov8n.yaml").model``, the ``DetectionModel`` a user holds: every path is a
    real submodule and is islanded."""
    import os

    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    import ampsafe

    model = YOLO("yolov8n.yaml").model
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert set(paths) <= set(result.patched) and not result.skipped, result
    for path in paths:
        assert type(model.get_submodule(path)).__name__.startswith("FP32Island"), path
