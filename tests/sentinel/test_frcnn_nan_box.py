"""The Faster R-CNN seed report (loss = nan in the first iterations), reproduced with one NaN box coordinate."""

from __future__ import annotations

import math

import pytest
import torch

import ampsafe


def _batch(nan_at=None):
    torch.manual_seed(1)
    images = [torch.rand(3, 320, 320) for _ in range(3)]
    targets = [
        {"boxes": torch.tensor([[10.0, 20, 100, 120], [50, 60, 200, 220]]), "labels": torch.tensor([1, 2])}
        for _ in range(3)
    ]
    if nan_at is not None:
        sample, box, coord = nan_at
        targets[sample]["boxes"][box, coord] = float("nan")
    return images, targets


def test_nan_box_passes_torchvision_silently_and_gives_nan_box_loss(frcnn_model):
    images, targets = _batch(nan_at=(2, 1, 0))
    with torch.no_grad():
        losses = frcnn_model(images, targets)
    assert math.isnan(float(losses["loss_box_reg"]))  # measured: no assert, no warning, just nan
    with pytest.raises(AssertionError, match="positive height and width"):  # while a zero-size box is refused
        bad = _batch()[1]
        bad[0]["boxes"][0, 2] = bad[0]["boxes"][0, 0]
        frcnn_model(images, bad)


def test_check_targets_names_sample_and_box_before_any_loss():
    images, targets = _batch(nan_at=(2, 1, 0))
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets(targets, image_size=(320, 320), num_classes=5)
    assert (info.value.sample, info.value.box) == (2, 1) and math.isnan(info.value.values[0])


def test_watch_names_the_input_transform_as_origin_with_the_sample(frcnn_model):
    images, targets = _batch(nan_at=(2, 1, 0))
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(frcnn_model):
        frcnn_model(images, targets)
    err = info.value
    # measured: the first op computing with the NaN is the box resize (x * ratio) in GeneralizedRCNNTransform
    assert (err.phase, err.module, err.op, err.kind, err.sample) == ("forward", "transform", "mul", "input", 2)
    assert "targets[2]['boxes'] row 1" in str(err)
    with ampsafe.watch(frcnn_model, on_nonfinite="record", backward=False) as w:  # clean data: nothing to report
        frcnn_model(*_batch())
    assert w.events == []
