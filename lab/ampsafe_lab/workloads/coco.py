"""COCO box mAP through pycocotools, framework-neutral: numpy boxes in, numbers out.

Both detectors report accuracy through this one function so their numbers mean the same thing, and the
metric itself is tested on cases whose answer is known (ground truth scores 1.0, shuffled boxes ~0).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np

from .shapes import make_samples

__all__ = ["coco_map", "held_out_map"]


def _as_boxes(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).reshape(-1, 4)


def coco_map(
    ground_truth: Sequence[dict],
    predictions: Sequence[dict],
    *,
    num_classes: int | None = None,
) -> dict:
    """COCO box metrics of ``predictions`` against ``ground_truth`` (one dict per image, same order).

    ``ground_truth[i]``: ``boxes`` (N, 4) xyxy pixels, ``labels`` (N,) ints. ``predictions[i]``: ``boxes``,
    ``labels`` and ``scores`` (M,). Returns ``{"map": AP@[.5:.95], "map50": AP@.5, "map75": AP@.75}``
    (0.0 when nothing was predicted; categories default to the labels seen in either list).
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(ground_truth) != len(predictions):
        raise ValueError(f"{len(ground_truth)} ground-truth images but {len(predictions)} prediction lists")
    labels = set()
    for item in (*ground_truth, *predictions):
        labels.update(int(v) for v in np.asarray(item["labels"]).reshape(-1))
    categories = sorted(set(range(num_classes)) if num_classes is not None else labels)

    images, annotations, results = [], [], []
    for image_id, (gt, pred) in enumerate(zip(ground_truth, predictions), start=1):
        images.append({"id": image_id})
        for box, label in zip(_as_boxes(gt["boxes"]), np.asarray(gt["labels"]).reshape(-1)):
            w, h = float(box[2] - box[0]), float(box[3] - box[1])
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(label),
                    "bbox": [float(box[0]), float(box[1]), w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        scores = np.asarray(pred["scores"], dtype=np.float64).reshape(-1)
        for box, label, score in zip(_as_boxes(pred["boxes"]), np.asarray(pred["labels"]).reshape(-1), scores):
            results.append(
                {
                    "image_id": image_id,
                    "category_id": int(label),
                    "bbox": [float(box[0]), float(box[1]), float(box[2] - box[0]), float(box[3] - box[1])],
                    "score": float(score),
                }
            )
    zero = {"map": 0.0, "map50": 0.0, "map75": 0.0}
    if not results or not annotations:
        return zero

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress and the summary table
        coco_gt = COCO()
        coco_gt.dataset = {
            "images": images,
            "annotations": annotations,
            "categories": [{"id": c} for c in categories],
        }
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results)
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [max(float(v), 0.0) for v in evaluator.stats[:3]]  # -1 means "no ground truth": report 0
    return {"map": stats[0], "map50": stats[1], "map75": stats[2]}


def held_out_map(workload, predict, *, n_images: int, batch_size: int) -> dict:
    """COCO mAP of a shapes detector (``frcnn``, ``ppyolo``) on ``n_images`` held-out images (eval split), its
    model in eval mode without gradients and restored after.

    ``predict(samples)`` returns one prediction dict (``boxes``, ``scores``, ``labels``) per sample.
    """
    samples = make_samples(workload.seed, 0, n_images, split="eval", **workload.sample_options)
    preds = []
    with workload.evaluating():
        for i in range(0, n_images, batch_size):
            preds += predict(samples[i : i + batch_size])
    gts = [{"boxes": s.boxes, "labels": s.labels} for s in samples]
    return coco_map(gts, preds, num_classes=workload.num_classes)
