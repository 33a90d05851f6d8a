"""``ampsafe run`` checks detection targets before the model (torchvision) or ppdet's target builder sees them."""

from __future__ import annotations

import sys

from run_helpers import SCRIPTS, ampsafe_run  # tests/run/run_helpers.py


def test_frcnn_zero_width_box_is_stopped_before_the_forward_naming_sample_and_box():
    proc = ampsafe_run("--", sys.executable, str(SCRIPTS / "train_frcnn.py"), "--bad-step", "1", "--bad-sample", "1")
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.BadTargetError"))
    assert "torchvision GeneralizedRCNN targets" in error
    assert "sample 1, box 1: [20, 10, 20, 50] degenerate box: width 0" in error
    assert "--on-bad-target drop" in error
    assert "script: step 0" in proc.stdout and "script: step 1" not in proc.stdout  # stopped before step 1 ran
    assert "All bounding boxes should have positive height and width" not in proc.stderr  # torchvision's assert


def test_frcnn_drop_removes_the_box_and_its_label_and_trains_on():
    proc = ampsafe_run(
        "--on-bad-target", "drop", "--", sys.executable, str(SCRIPTS / "train_frcnn.py"), "--bad-step", "1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: step 1 loss" in proc.stdout and "boxes [2, 1]" in proc.stdout and "script: done" in proc.stdout
    assert "dropped bad box (sample 1)" in proc.stderr
    assert "1 bad box(es) in 2 batch(es) checked (drop)" in proc.stdout


def test_ppdet_gt2yolotarget_degenerate_box_raises_by_default():
    proc = ampsafe_run("--", sys.executable, str(SCRIPTS / "ppdet_targets.py"))
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.BadTargetError"))
    assert "ppdet Gt2YoloTarget" in error and "sample 1, box 1" in error and "degenerate box: width 0" in error


def test_ppdet_gt2yolotarget_drop_builds_targets_without_the_box():
    proc = ampsafe_run("--on-bad-target", "drop", "--", sys.executable, str(SCRIPTS / "ppdet_targets.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: targets built, boxes per sample [2, 1]" in proc.stdout
    assert "boxes assigned to anchors per sample [2, 1]" in proc.stdout
    assert "dropped bad box (sample 1)" in proc.stderr
