"""check_targets and the checked() wrapper: bad boxes are named before ppdet drops or crashes on them, or
torchvision turns them into loss = nan."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import ampsafe
from ampsafe.core.targets import checked, find_bad_boxes

YOLO_ANCHORS = [[10, 13], [16, 30], [33, 23], [30, 61], [62, 45], [59, 119], [116, 90], [156, 198], [373, 326]]


def tv_targets(n=2):
    return [
        {"boxes": torch.tensor([[10.0, 20, 100, 120], [50, 60, 200, 220]]), "labels": torch.tensor([1, 2])}
        for _ in range(n)
    ]


def yolo_sample(box, cls=3):
    """A ppdet sample as Gt2YoloTarget reads it: CHW image, normalized cx, cy, w, h boxes."""
    return {
        "image": np.zeros((3, 320, 320), np.float32),
        "gt_bbox": np.array([box], np.float32),
        "gt_class": np.array([[cls]], np.int32),
    }


def test_nan_box_coordinate_names_sample_box_and_values():
    targets = tv_targets()
    targets[1]["boxes"][1, 0] = float("nan")
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets(targets)
    err = info.value
    assert (err.sample, err.box) == (1, 1)
    assert math.isnan(err.values[0]) and err.values[1:] == (60.0, 200.0, 220.0)
    assert "non-finite" in err.reason and "x1" in err.reason
    assert "sample 1, box 1" in str(err)


@pytest.mark.parametrize(
    ("box", "reason"),
    [
        ([10, 10, 10, 50], "degenerate"),
        ([30, 10, 10, 50], "degenerate"),
        ([10, 10, 10 + 1e-30, 50], "degenerate"),  # 10 + 1e-30 == 10 in float32
        ([10, 10, 10.001, 50], "too small"),
        ([10, 10, float("inf"), 50], "non-finite"),
        ([10, 10, 400, 50], "outside"),
        ([-5, 10, 40, 50], "outside"),
    ],
)
def test_torchvision_style_bad_boxes_are_named(box, reason):
    targets = tv_targets()
    targets[0]["boxes"][1] = torch.tensor(box, dtype=torch.float32)
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets(targets, image_size=(320, 320))
    assert (info.value.sample, info.value.box) == (0, 1)
    assert reason in info.value.reason


def test_class_id_out_of_range_is_named():
    targets = tv_targets()
    targets[1]["labels"][0] = 7
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets(targets, num_classes=5)
    assert (info.value.sample, info.value.box) == (1, 0) and "class id 7" in info.value.reason
    ampsafe.check_targets(tv_targets(), num_classes=5, image_size=(320, 320))  # valid targets pass


def test_valid_targets_pass_in_every_array_flavour():
    paddle = pytest.importorskip("paddle")
    boxes = [[10.0, 20, 100, 120]]
    for make in (
        np.array,
        torch.tensor,
        lambda b: torch.tensor(b, dtype=torch.float32, requires_grad=True),
        paddle.to_tensor,
    ):
        ampsafe.check_targets([{"boxes": make(boxes), "labels": make([1])}], image_size=(320, 320))
    bad = [{"gt_bbox": paddle.to_tensor([[10.0, 20, 5, 120]]), "gt_class": paddle.to_tensor([[1]])}]
    with pytest.raises(ampsafe.BadTargetError):
        ampsafe.check_targets(bad)


@pytest.fixture(scope="module")
def gt2yolo():
    from ppdet.data.transform.batch_operators import Gt2YoloTarget

    return Gt2YoloTarget(
        anchor_masks=[[6, 7, 8], [3, 4, 5], [0, 1, 2]],
        anchors=YOLO_ANCHORS,
        downsample_ratios=[32, 16, 8],
        num_classes=80,
    )


def _objects_and_wh(sample):
    targets = [sample[f"target{i}"] for i in range(3)]
    objects = sum(float(t[:, 5].sum()) for t in targets)
    wh = [float(v) for t in targets for v in t[:, 2][t[:, 5] > 0]]
    return objects, wh


@pytest.mark.parametrize(
    ("box", "reason"),
    [
        ([0.5, 0.5, 0.0, 0.3], "degenerate"),
        ([0.5, 0.5, -0.1, 0.3], "degenerate"),
        ([0.5, 0.5, float("nan"), 0.3], "non-finite"),
        ([0.5, 0.5, float("inf"), 0.3], "non-finite"),
    ],
)
def test_ppdet_gt2yolo_silently_drops_box_that_check_targets_names(gt2yolo, box, reason):
    assert _objects_and_wh(gt2yolo([yolo_sample([0.5, 0.5, 0.2, 0.3])])[0])[0] == 1.0  # a valid box is kept
    objects, _ = _objects_and_wh(gt2yolo([yolo_sample(box)])[0])
    assert objects == 0.0  # ppdet: dropped, nobody told
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets([yolo_sample(box)], box_format="cxcywh")
    assert (info.value.sample, info.value.box) == (0, 0) and reason in info.value.reason


def test_ppdet_gt2yolo_crashes_on_nan_centre_that_check_targets_names(gt2yolo):
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        gt2yolo([yolo_sample([float("nan"), 0.5, 0.2, 0.3])])
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets([yolo_sample([float("nan"), 0.5, 0.2, 0.3])], box_format="cxcywh")
    assert "cx" in info.value.reason


def test_ppdet_gt2yolo_turns_1e30_wide_box_into_huge_log_target_that_check_targets_names(gt2yolo):
    objects, wh = _objects_and_wh(gt2yolo([yolo_sample([0.5, 0.5, 1e-30, 0.3])])[0])
    assert objects == 1.0 and wh[0] < -60  # measured: -65.6, a regression target no head can reach
    with pytest.raises(ampsafe.BadTargetError) as info:
        ampsafe.check_targets([yolo_sample([0.5, 0.5, 1e-30, 0.3])], box_format="cxcywh")
    assert "too small" in info.value.reason and info.value.values[2] == pytest.approx(1e-30)


def test_ppdet_batch_dict_skips_padding_rows_and_finds_bad_one():
    gt = np.zeros((2, 4, 4), np.float32)
    gt[0, 0] = [10, 10, 50, 50]
    gt[1, 0] = [10, 10, 50, 50]
    gt[1, 1] = [60, 60, 60, 90]  # zero width
    batch = {"gt_bbox": gt, "gt_class": np.zeros((2, 4, 1), np.int32), "im_shape": np.full((2, 2), 320.0)}
    problems = find_bad_boxes(batch)
    assert [(p.sample, p.box) for p in problems] == [(1, 1)]


def test_checked_collate_raises_or_drops_bad_box_with_warning():
    def collate(batch):
        return tuple(zip(*batch))

    targets = tv_targets(3)
    targets[2]["boxes"][0, 3] = float("nan")
    batch = [(torch.zeros(3, 8, 8), t) for t in targets]
    with pytest.raises(ampsafe.BadTargetError) as info:
        checked(collate)(batch)
    assert (info.value.sample, info.value.box) == (2, 0)
    with pytest.warns(RuntimeWarning, match="dropped bad box"):
        images, out = checked(collate, policy="drop")(batch)
    assert out[2]["boxes"].shape == (1, 4) and out[2]["labels"].tolist() == [2]
    assert out[0]["boxes"].shape == (2, 4)
    ampsafe.check_targets(list(out))


def test_checked_dataset_names_dataset_index():
    targets = tv_targets(4)
    targets[3]["boxes"][1] = torch.tensor([5.0, 5, 1, 1])
    dataset = [(torch.zeros(3, 8, 8), t) for t in targets]
    wrapped = checked(dataset)
    assert len(wrapped) == 4 and wrapped[0][1]["boxes"].shape == (2, 4)
    with pytest.raises(ampsafe.BadTargetError) as info:
        wrapped[3]
    assert info.value.sample == 3 and "dataset index 3" in str(info.value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert checked(dataset, policy="drop")[3][1]["boxes"].shape == (1, 4)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ampsafe.ConfigError):
        ampsafe.check_targets([{"bbox": np.zeros((1, 4))}])
    with pytest.raises(ampsafe.ConfigError):
        checked(lambda b: b, policy="ignore")
