"""A deterministic synthetic detection dataset: filled shapes on noisy backgrounds, with exact boxes.

Both detector workloads (torch Faster R-CNN and Paddle PP-YOLO) train on it, so they see the same kind of data
without downloads. numpy only. Class ``c`` is shape ``c % 3`` (rectangle, ellipse, triangle) in palette
``c // 3``, so the class is visible in the pixels. Objects never overlap, so every box is the exact extent of
its drawn pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ShapesSample", "SHAPES", "MAX_CLASSES", "make_sample", "make_samples"]

SHAPES = ("rectangle", "ellipse", "triangle")
# palettes: (shape colour range per channel); backgrounds stay mid-grey so every palette contrasts
_PALETTES = (
    ((200, 255), (30, 90), (30, 90)),  # reddish
    ((30, 90), (200, 255), (30, 90)),  # greenish
    ((30, 90), (30, 90), (200, 255)),  # bluish
)
MAX_CLASSES = len(SHAPES) * len(_PALETTES)
_TRAIN, _EVAL = 0, 1


@dataclass
class ShapesSample:
    """``image``: uint8 HxWx3; ``boxes``: float32 (N, 4) xyxy in pixels; ``labels``: int64 (N,) in 0..C-1."""

    image: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray


def _rng(seed: int, split: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), split, int(index)]))


def _shape_mask(kind: str, h: int, w: int) -> np.ndarray:
    """Boolean mask of a shape filling an h x w box (touching all four sides, so the box is tight)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == "rectangle":
        return np.ones((h, w), bool)
    if kind == "ellipse":
        cy, cx = (h - 1) / 2, (w - 1) / 2
        mask = ((yy - cy) / max(h / 2, 0.5)) ** 2 + ((xx - cx) / max(w / 2, 0.5)) ** 2 <= 1.0
    else:  # triangle: apex top centre, base along the bottom row
        half = (w - 1) / 2 * yy / max(h - 1, 1)
        mask = np.abs(xx - (w - 1) / 2) <= half + 0.5
    # make sure the extreme rows/columns are covered so the tight box equals the drawn extent
    mask[h // 2, :] |= kind == "ellipse"
    mask[:, w // 2] = True
    mask[-1, :] = True
    return mask


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    base = rng.uniform(90, 150)
    gy, gx = rng.uniform(-25, 25, size=2)
    ramp = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    img = base + gy * ramp[:, None] + gx * ramp[None, :]
    img = img[..., None] + rng.normal(0, 12, size=(size, size, 3))
    return img


def make_sample(
    seed: int,
    index: int,
    *,
    image_size: int = 320,
    num_classes: int = 3,
    max_objects: int = 4,
    min_frac: float = 0.12,
    max_frac: float = 0.45,
    split: str = "train",
) -> ShapesSample:
    """Sample ``index`` of the ``split`` ("train" or "eval") stream for ``seed``: same arguments, same pixels."""
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes must be in 1..{MAX_CLASSES}, got {num_classes}")
    rng = _rng(seed, _TRAIN if split == "train" else _EVAL, index)
    size = int(image_size)
    img = _background(rng, size)
    n_target = int(rng.integers(1, max_objects + 1))
    boxes, labels = [], []
    lo, hi = max(4, int(min_frac * size)), max(5, int(max_frac * size))
    for _ in range(n_target * 10):  # rejection sampling for non-overlapping placements
        if len(boxes) == n_target:
            break
        w, h = (int(v) for v in rng.integers(lo, hi + 1, size=2))
        x0, y0 = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
        box = (x0, y0, x0 + w, y0 + h)
        if any(box[0] < b[2] + 2 and b[0] < box[2] + 2 and box[1] < b[3] + 2 and b[1] < box[3] + 2 for b in boxes):
            continue
        cls = int(rng.integers(0, num_classes))
        palette = _PALETTES[cls // len(SHAPES)]
        colour = np.array([rng.uniform(*ch) for ch in palette], np.float32)
        mask = _shape_mask(SHAPES[cls % len(SHAPES)], h, w)
        region = img[y0 : y0 + h, x0 : x0 + w]
        region[mask] = colour + rng.normal(0, 6, size=(int(mask.sum()), 3))
        boxes.append(box)
        labels.append(cls)
    image = np.clip(img, 0, 255).astype(np.uint8)
    return ShapesSample(
        image=image,
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        labels=np.asarray(labels, np.int64),
    )


def make_samples(seed: int, start: int, count: int, **options) -> list[ShapesSample]:
    """``count`` consecutive samples from ``start`` (a batch is ``make_samples(seed, step * bs, bs)``)."""
    return [make_sample(seed, start + i, **options) for i in range(count)]
