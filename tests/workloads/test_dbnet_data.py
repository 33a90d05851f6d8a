"""DB targets and post-processing, checked by round trips that cannot lie."""

from __future__ import annotations

import numpy as np
import pytest
from shapely.geometry import Polygon

from ampsafe_lab.workloads.dbnet.data import (
    make_batch,
    make_border_map,
    make_shrink_map,
    shrink_distance,
    shrink_polygon,
)
from ampsafe_lab.workloads.dbnet.postprocess import boxes_from_map, detection_metrics, polygon_iou


def _rect(x0, y0, w, h):
    return np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h]], dtype=np.float32)


def test_shrink_offset_of_a_rectangle_equals_db_formula():
    w, h, r = 60.0, 20.0, 0.4
    expected = (w * h) * (1 - r**2) / (2 * (w + h))  # D = A (1 - r^2) / L = 6.3
    assert shrink_distance(_rect(10, 10, w, h), r) == pytest.approx(expected, abs=1e-9)
    (shrunk,) = shrink_polygon(_rect(10, 10, w, h), r)
    xs, ys = shrunk[:, 0], shrunk[:, 1]
    # pyclipper works on integer coordinates: each side moves inwards by D, within a pixel
    assert xs.min() - 10 == pytest.approx(expected, abs=1.0) and 70 - xs.max() == pytest.approx(expected, abs=1.0)
    assert ys.min() - 10 == pytest.approx(expected, abs=1.0) and 30 - ys.max() == pytest.approx(expected, abs=1.0)


def test_shrink_map_fills_exactly_the_shrunk_rectangle():
    gt, mask = make_shrink_map([_rect(10, 10, 60, 20)], 64, 96)
    d = 1200 * 0.84 / 160
    rows, cols = np.nonzero(gt)
    assert rows.min() == pytest.approx(10 + d, abs=1) and rows.max() == pytest.approx(30 - d, abs=1)
    assert cols.min() == pytest.approx(10 + d, abs=1) and cols.max() == pytest.approx(70 - d, abs=1)
    assert mask.min() == 1.0  # large enough: nothing ignored


def test_small_text_is_masked_out_not_labelled():
    gt, mask = make_shrink_map([_rect(5, 5, 30, 6)], 32, 48)
    assert gt.max() == 0 and mask[7, 20] == 0


def test_threshold_map_spans_point3_to_point7_and_peaks_on_the_border():
    canvas, mask = make_border_map([_rect(20, 20, 40, 20)], 64, 96)
    assert canvas.min() == pytest.approx(0.3) and canvas.max() == pytest.approx(0.7, abs=1e-6)
    assert canvas[20, 40] == pytest.approx(0.7, abs=1e-6)  # on the top edge
    assert canvas[30, 40] == pytest.approx(0.3, abs=1e-6)  # centre: farther than D from every edge
    assert mask[20 - 3, 40] == 1 and mask[0, 0] == 0  # the dilated polygon is supervised, far pixels not


@pytest.fixture(scope="module")
def held_out():
    return [make_batch(0, i, 8, 128, stream=1) for i in range(8)]


def test_ground_truth_shrink_map_round_trips_to_hmean_one(held_out):
    predictions, labels = [], []
    for batch in held_out:
        for shrink, polys in zip(batch["shrink_map"], batch["polys"]):
            predictions.append(boxes_from_map(shrink)[0])
            labels.append(polys)
    metrics = detection_metrics(predictions, labels)
    assert metrics["labels"] >= 100
    assert metrics["hmean"] == 1.0 and metrics["precision"] == 1.0 and metrics["recall"] == 1.0


def test_empty_prediction_scores_zero(held_out):
    labels = [p for batch in held_out for p in batch["polys"]]
    assert detection_metrics([[] for _ in labels], labels)["hmean"] == 0.0
    blank = boxes_from_map(np.zeros((128, 128), np.float32))[0]
    assert blank == []


def test_shifted_boxes_fail_the_iou_half_rule():
    gt = [_rect(10, 10, 40, 20)]
    assert detection_metrics([[_rect(10, 10, 40, 20)]], [gt])["hmean"] == 1.0
    assert polygon_iou(gt[0], _rect(30, 10, 40, 20)) == pytest.approx(1 / 3)
    assert detection_metrics([[_rect(30, 10, 40, 20)]], [gt])["hmean"] == 0.0


def test_batches_are_deterministic_and_distinct_per_step():
    a, b, c = make_batch(3, 5, 2, 64), make_batch(3, 5, 2, 64), make_batch(3, 6, 2, 64)
    for key in ("image", "threshold_map", "threshold_mask", "shrink_map", "shrink_mask"):
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["image"], c["image"])
    assert a["image"].shape == (2, 3, 64, 64) and a["image"].dtype == np.float32
    assert all(Polygon(p).area > 0 for polys in a["polys"] for p in polys)


def test_train_and_held_out_streams_differ():
    train, held = make_batch(0, 0, 2, 64, stream=0), make_batch(0, 0, 2, 64, stream=1)
    assert not np.array_equal(train["image"], held["image"])
