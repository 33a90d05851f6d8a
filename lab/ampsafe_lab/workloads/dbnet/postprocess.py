"""DB post-processing (probability map -> quadrilaterals) and the detection hmean at IoU 0.5.

Boxes: binarize at ``thresh``, take contours, fit the minimum-area rectangle, keep it if the mean probability
inside is at least ``box_thresh``, grow it back by D' = A * unclip_ratio / L (undoing the training shrink),
refit. The metric matches each label to at most one detection with IoU > 0.5 (greedy, in order) and reports
precision, recall and their harmonic mean over the whole set, as PaddleOCR's DetMetric does.
"""

from __future__ import annotations

import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

__all__ = ["boxes_from_map", "polygon_iou", "detection_metrics"]

_MIN_SIDE = 3


def _min_area_quad(points: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle as (4, 2) clockwise from top-left, and its shorter side."""
    rect = cv2.minAreaRect(points.reshape(-1, 1, 2).astype(np.float32))
    corners = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(corners[:2], key=lambda p: p[1])
    right = sorted(corners[2:], key=lambda p: p[1])
    quad = np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)
    return quad, float(min(rect[1]))


def _mean_inside(prob: np.ndarray, quad: np.ndarray) -> float:
    h, w = prob.shape
    x0, x1 = np.clip([np.floor(quad[:, 0].min()), np.ceil(quad[:, 0].max())], 0, w - 1).astype(int)
    y0, y1 = np.clip([np.floor(quad[:, 1].min()), np.ceil(quad[:, 1].max())], 0, h - 1).astype(int)
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    cv2.fillPoly(mask, [(quad - [x0, y0]).astype(np.int32)], 1)
    return float(cv2.mean(prob[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


def _unclip(quad: np.ndarray, ratio: float) -> list[np.ndarray]:
    shape = Polygon(quad)
    if shape.length == 0:
        return []
    clipper = pyclipper.PyclipperOffset()
    clipper.AddPath([tuple(p) for p in quad], pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return [np.array(p, dtype=np.float32) for p in clipper.Execute(shape.area * ratio / shape.length)]


def boxes_from_map(
    prob: np.ndarray,
    *,
    thresh: float = 0.3,
    box_thresh: float = 0.6,
    unclip_ratio: float = 1.5,
    max_candidates: int = 1000,
    dest_size: tuple[int, int] | None = None,
) -> tuple[list[np.ndarray], list[float]]:
    """Quadrilaterals (each (4, 2) float32, in ``dest_size`` = (height, width) pixels) and their scores."""
    prob = np.asarray(prob, dtype=np.float32)
    height, width = prob.shape
    dest_h, dest_w = dest_size or (height, width)
    bitmap = (prob > thresh).astype(np.uint8) * 255
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    for contour in contours[:max_candidates]:
        quad, short_side = _min_area_quad(contour)
        if short_side < _MIN_SIDE:
            continue
        score = _mean_inside(prob, quad)
        if score < box_thresh:
            continue
        grown = _unclip(quad, unclip_ratio)
        if not grown:
            continue
        quad, short_side = _min_area_quad(grown[0])
        if short_side < _MIN_SIDE + 2:
            continue
        quad[:, 0] = np.clip(np.round(quad[:, 0] / width * dest_w), 0, dest_w)
        quad[:, 1] = np.clip(np.round(quad[:, 1] / height * dest_h), 0, dest_h)
        boxes.append(quad)
        scores.append(score)
    return boxes, scores


def polygon_iou(a: np.ndarray, b: np.ndarray) -> float:
    pa, pb = Polygon(a), Polygon(b)
    if not pa.is_valid or not pb.is_valid:
        pa, pb = pa.buffer(0), pb.buffer(0)
    union = pa.union(pb).area
    return float(pa.intersection(pb).area / union) if union > 0 else 0.0


def detection_metrics(predictions, labels, *, iou_threshold: float = 0.5) -> dict:
    """``predictions``/``labels``: per image, a list of polygons. Returns precision, recall, hmean (0 if none)."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} prediction lists for {len(labels)} label lists")
    matched = n_pred = n_gt = 0
    for preds, gts in zip(predictions, labels):
        n_pred += len(preds)
        n_gt += len(gts)
        used = [False] * len(preds)
        for gt in gts:
            for j, pred in enumerate(preds):
                if not used[j] and polygon_iou(gt, pred) > iou_threshold:
                    used[j] = True
                    matched += 1
                    break
    precision = matched / n_pred if n_pred else 0.0
    recall = matched / n_gt if n_gt else 0.0
    hmean = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "hmean": hmean,
        "matched": matched,
        "detections": n_pred,
        "labels": n_gt,
    }
