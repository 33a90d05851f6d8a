"""ppdet's Gt2YoloTarget on a batch whose second sample has a degenerate box (knows nothing about ampsafe)."""

import numpy as np
from ppdet.data.transform.batch_operators import Gt2YoloTarget

op = Gt2YoloTarget(
    anchors=[[10, 13], [16, 30], [33, 23], [30, 61], [62, 45], [59, 119]],
    anchor_masks=[[3, 4, 5], [0, 1, 2]],
    downsample_ratios=[32, 16],
    num_classes=3,
)
samples = []
for i in range(2):
    gt_bbox = np.array([[0.3, 0.3, 0.2, 0.25], [0.6, 0.5, 0.3, 0.4]], dtype=np.float32)  # cx, cy, w, h normalized
    if i == 1:
        gt_bbox[1, 2] = 0.0  # zero width: Gt2YoloTarget would skip it silently
    samples.append(
        {
            "image": np.zeros((3, 64, 64), dtype=np.float32),
            "gt_bbox": gt_bbox,
            "gt_class": np.array([[1], [2]], dtype=np.int32),
            "im_id": np.array([100 + i]),
        }
    )
out = op(samples)
print(
    f"script: targets built, boxes per sample {[int((s['gt_bbox'] != 0).any(axis=1).sum()) for s in out]}", flush=True
)  # all-zero rows are padding
assigned = [int(sum((s[k][:, 6:] > 0).sum() for k in ("target0", "target1"))) for s in out]
print(f"script: boxes assigned to anchors per sample {assigned}", flush=True)
