"""COCO mAP (pycocotools) on answers known in advance, and the synthetic shapes dataset it scores."""

from __future__ import annotations

import numpy as np
import pytest

from ampsafe_lab.workloads.coco import coco_map
from ampsafe_lab.workloads.shapes import MAX_CLASSES, make_sample, make_samples


@pytest.fixture(scope="module")
def det_gt():
    return [{"boxes": s.boxes, "labels": s.labels} for s in make_samples(0, 0, 12, image_size=256)]


def test_ground_truth_as_predictions_scores_map_one(det_gt):
    preds = [{**g, "scores": np.ones(len(g["labels"]))} for g in det_gt]
    metrics = coco_map(det_gt, preds, num_classes=3)
    assert metrics["map"] == pytest.approx(1.0)
    assert metrics["map50"] == pytest.approx(1.0)


def test_shuffled_boxes_score_near_zero(det_gt):
    rng = np.random.default_rng(0)
    boxes = np.concatenate([g["boxes"] for g in det_gt])
    labels = np.concatenate([g["labels"] for g in det_gt])
    order = rng.permutation(len(boxes))
    boxes, labels = boxes[order], labels[order]
    preds, start = [], 0
    for g in det_gt:  # same number of boxes per image, but each taken from a random other place
        n = len(g["labels"])
        preds.append({"boxes": boxes[start : start + n], "labels": labels[start : start + n], "scores": np.ones(n)})
        start += n
    metrics = coco_map(det_gt, preds, num_classes=3)
    assert metrics["map50"] < 0.1
    assert metrics["map"] < 0.05


def test_half_the_boxes_found_scores_about_half(det_gt):
    preds = []
    for g in det_gt:
        keep = np.arange(len(g["labels"])) % 2 == 0
        preds.append({"boxes": g["boxes"][keep], "labels": g["labels"][keep], "scores": np.ones(keep.sum())})
    found = sum(int(p["labels"].size) for p in preds) / sum(int(g["labels"].size) for g in det_gt)
    assert 0.3 < coco_map(det_gt, preds, num_classes=3)["map50"] <= found + 0.1


def test_no_predictions_score_zero(det_gt):
    empty = [{"boxes": np.zeros((0, 4)), "labels": np.zeros(0, int), "scores": np.zeros(0)} for _ in det_gt]
    assert coco_map(det_gt, empty) == {"map": 0.0, "map50": 0.0, "map75": 0.0}


def test_mismatched_image_counts_raise(det_gt):
    with pytest.raises(ValueError, match="prediction"):
        coco_map(det_gt, [])


def test_shapes_samples_are_deterministic_and_streams_distinct():
    a, b = make_sample(3, 7, image_size=128), make_sample(3, 7, image_size=128)
    assert np.array_equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)
    assert not np.array_equal(a.image, make_sample(3, 8, image_size=128).image)
    assert not np.array_equal(a.image, make_sample(4, 7, image_size=128).image)
    assert not np.array_equal(a.image, make_sample(3, 7, image_size=128, split="eval").image)


def test_shapes_boxes_are_valid_disjoint_and_drawn():
    for s in make_samples(1, 0, 20, image_size=160, num_classes=MAX_CLASSES):
        assert s.image.shape == (160, 160, 3) and s.image.dtype == np.uint8
        assert len(s.boxes) >= 1 and s.labels.min() >= 0 and s.labels.max() < MAX_CLASSES
        assert (s.boxes[:, 2] > s.boxes[:, 0]).all() and (s.boxes[:, 3] > s.boxes[:, 1]).all()
        assert s.boxes.min() >= 0 and s.boxes.max() <= 160
        for i, (x0, y0, x1, y1) in enumerate(s.boxes.astype(int)):
            # the drawn shape is saturated in one channel, the grey background is not
            region = s.image[y0:y1, x0:x1].astype(int)
            assert (region.max(axis=2) - region.min(axis=2) > 80).mean() > 0.4
            for bx0, by0, bx1, by1 in s.boxes[i + 1 :].astype(int):
                assert x1 <= bx0 or bx1 <= x0 or y1 <= by0 or by1 <= y0


def test_shapes_reject_unknown_class_counts():
    with pytest.raises(ValueError, match="num_classes"):
        make_sample(0, 0, num_classes=MAX_CLASSES + 1)
