"""Synthetic text-detection data and the DB training targets (PaddleOCR's MakeShrinkMap / MakeBorderMap).

Images are word-like strings drawn dark-on-bright or bright-on-dark over textured backgrounds, labelled with
the word's tight quadrilateral. Targets follow DB: the shrink map fills each polygon shrunk by
D = A (1 - r^2) / L (r = 0.4); the threshold map rises from 0.3 to 0.7 towards the text border inside the
polygon dilated by the same D. Everything is a pure function of a numpy Generator, so batches are
reproducible from (seed, step).
"""

from __future__ import annotations

import string

import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

from ..imagenet import IMAGE_MEAN, IMAGE_STD, normalize_chw

__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "shrink_distance",
    "shrink_polygon",
    "make_shrink_map",
    "make_border_map",
    "synth_text_image",
    "normalize_image",
    "make_sample",
    "make_batch",
    "sample_rng",
]

_FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_COMPLEX)
_LETTERS = string.ascii_letters + string.digits
TRAIN_STREAM, EVAL_STREAM = 0, 1
_MAX_ASPECT = 3.8


def sample_rng(seed: int, stream: int, index: int, item: int = 0) -> np.random.Generator:
    """Independent generator per (seed, stream, index, item): train (stream 0) and held-out eval (1) never mix."""
    return np.random.default_rng([int(seed), int(stream), int(index), int(item)])


# ---------------------------------------------------------------------------------------------- targets
def shrink_distance(polygon: np.ndarray, ratio: float = 0.4) -> float:
    """DB's offset: D = A (1 - r^2) / L for a polygon of area A and perimeter L."""
    shape = Polygon(polygon)
    return float(shape.area * (1 - ratio**2) / shape.length) if shape.length > 0 else 0.0


def _offset(polygon: np.ndarray, distance: float) -> list[np.ndarray]:
    clipper = pyclipper.PyclipperOffset()
    clipper.AddPath([tuple(p) for p in np.asarray(polygon)], pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return [np.array(path, dtype=np.float64).reshape(-1, 2) for path in clipper.Execute(distance)]


def shrink_polygon(polygon: np.ndarray, ratio: float = 0.4) -> list[np.ndarray]:
    """Shrink by D(ratio); if that splits the polygon, retry with larger ratios (less shrinking), as upstream."""
    shrunk: list[np.ndarray] = []
    for r in np.arange(ratio, 1, ratio):
        shrunk = _offset(polygon, -shrink_distance(polygon, r))
        if len(shrunk) == 1:
            break
    return shrunk


def make_shrink_map(polys, height: int, width: int, *, shrink_ratio=0.4, min_text_size=8, ignore_tags=None):
    """(shrink_map, shrink_mask) float32 (H, W); small, degenerate or ignored polygons are masked out."""
    gt = np.zeros((height, width), dtype=np.float32)
    mask = np.ones((height, width), dtype=np.float32)
    for index, poly in enumerate(polys):
        poly = np.asarray(poly, dtype=np.float64).copy()
        poly[:, 0] = np.clip(poly[:, 0], 0, width - 1)
        poly[:, 1] = np.clip(poly[:, 1], 0, height - 1)
        extent = poly.max(axis=0) - poly.min(axis=0)
        ignored = ignore_tags is not None and ignore_tags[index]
        if ignored or Polygon(poly).area < 1 or extent.min() < min_text_size:
            cv2.fillPoly(mask, [poly.astype(np.int32)], 0)
            continue
        shrunk = shrink_polygon(poly, shrink_ratio)
        if not shrunk:
            cv2.fillPoly(mask, [poly.astype(np.int32)], 0)
            continue
        for part in shrunk:
            cv2.fillPoly(gt, [part.astype(np.int32)], 1)
    return gt, mask


def _segment_distance(xs, ys, a, b):
    """Euclidean distance from grid points (xs, ys) to the segment a-b."""
    ab = b - a
    length2 = float(ab @ ab)
    if length2 == 0:
        return np.hypot(xs - a[0], ys - a[1])
    t = np.clip(((xs - a[0]) * ab[0] + (ys - a[1]) * ab[1]) / length2, 0.0, 1.0)
    return np.hypot(xs - (a[0] + t * ab[0]), ys - (a[1] + t * ab[1]))


def _draw_border(poly: np.ndarray, canvas: np.ndarray, mask: np.ndarray, ratio: float) -> None:
    distance = shrink_distance(poly, ratio)
    if distance <= 0:
        return
    padded = _offset(poly, distance)[0]
    cv2.fillPoly(mask, [padded.astype(np.int32)], 1.0)
    x0, y0 = padded.min(axis=0).astype(int)
    x1, y1 = padded.max(axis=0).astype(int)
    ys, xs = np.mgrid[y0 : y1 + 1, x0 : x1 + 1].astype(np.float64)
    nearest = np.full(xs.shape, np.inf)
    for i in range(len(poly)):
        nearest = np.minimum(nearest, _segment_distance(xs, ys, poly[i], poly[(i + 1) % len(poly)]))
    closeness = 1 - np.clip(nearest / distance, 0, 1)
    h, w = canvas.shape
    cx0, cx1, cy0, cy1 = max(x0, 0), min(x1, w - 1), max(y0, 0), min(y1, h - 1)
    if cx0 > cx1 or cy0 > cy1:
        return
    window = closeness[cy0 - y0 : cy1 - y0 + 1, cx0 - x0 : cx1 - x0 + 1]
    canvas[cy0 : cy1 + 1, cx0 : cx1 + 1] = np.fmax(canvas[cy0 : cy1 + 1, cx0 : cx1 + 1], window)


def make_border_map(
    polys, height: int, width: int, *, shrink_ratio=0.4, thresh_min=0.3, thresh_max=0.7, ignore_tags=None
):
    """(threshold_map, threshold_mask) float32 (H, W): thresh_min far from borders, thresh_max on them."""
    canvas = np.zeros((height, width), dtype=np.float32)
    mask = np.zeros((height, width), dtype=np.float32)
    for index, poly in enumerate(polys):
        if ignore_tags is not None and ignore_tags[index]:
            continue
        poly = np.asarray(poly, dtype=np.float64)
        if Polygon(poly).area > 0:
            _draw_border(poly, canvas, mask, shrink_ratio)
    return canvas * (thresh_max - thresh_min) + thresh_min, mask


# ---------------------------------------------------------------------------------------------- images
def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth colour gradient + blotchy low-frequency noise + fine grain + a few faint strokes."""
    base = rng.uniform(40, 215, size=3)
    tilt = rng.uniform(-40, 40, size=(2, 3))
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    img = base + xx[..., None] * tilt[0] + yy[..., None] * tilt[1]
    cells = int(rng.integers(3, 8))
    blotches = cv2.resize(rng.normal(0, 18, size=(cells, cells, 3)).astype(np.float32), (size, size))
    img = img + blotches + rng.normal(0, 6, size=(size, size, 3))
    img = np.clip(img, 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(0, 4))):
        p0, p1 = tuple(int(v) for v in rng.integers(0, size, 2)), tuple(int(v) for v in rng.integers(0, size, 2))
        shade = tuple(float(v) for v in np.clip(base + rng.normal(0, 25, 3), 0, 255))
        cv2.line(img, p0, p1, shade, 1, cv2.LINE_AA)
    return img


def _word_mask(rng: np.random.Generator, size: int) -> tuple[np.ndarray, int, int] | None:
    """A random word rendered on its own mask; returns (mask, width, height) or None if it cannot fit.

    Words are at least 14 px tall and at most ~4x wider than tall: DB's shrink (r = 0.4) leaves only 16% of a
    box's height, so thinner boxes lose the ground-truth round trip to pixel rounding.
    """
    font = _FONTS[int(rng.integers(len(_FONTS)))]
    target_height = max(rng.uniform(0.11, 0.18) * size, 14.0)
    length = int(rng.integers(2, 6))
    while length >= 1:
        text = "".join(rng.choice(list(_LETTERS), size=length))
        (_, text_h), _ = cv2.getTextSize(text, font, 1.0, 2)
        scale = target_height / max(text_h, 1)
        thickness = 2 if target_height >= 16 else 1
        (w, h), baseline = cv2.getTextSize(text, font, scale, thickness)
        canvas = np.zeros((h + baseline + 4, w + 4), dtype=np.uint8)
        cv2.putText(canvas, text, (2, h + 2), font, scale, 255, thickness, cv2.LINE_AA)
        x, y, bw, bh = cv2.boundingRect((canvas > 64).astype(np.uint8))
        if 0 < bw <= size - 6 and bh <= size - 6 and bw + 1 <= _MAX_ASPECT * (bh + 1):
            return canvas[y : y + bh, x : x + bw], bw, bh
        length -= 1
    return None


def synth_text_image(rng: np.random.Generator, size: int = 128, max_words: int = 4):
    """(image uint8 (size, size, 3) BGR, list of (4, 2) float32 clockwise quads around each word)."""
    img = _background(rng, size).astype(np.float32)
    occupied = np.zeros((size, size), dtype=bool)
    polys = []
    for _ in range(int(rng.integers(1, max_words + 1)) * 6):  # a few placement tries per word
        if len(polys) >= max_words:
            break
        word = _word_mask(rng, size)
        if word is None:
            continue
        mask, w, h = word
        x, y = int(rng.integers(2, size - w - 1)), int(rng.integers(2, size - h - 1))
        if occupied[max(y - 3, 0) : y + h + 3, max(x - 3, 0) : x + w + 3].any():
            continue
        occupied[y : y + h, x : x + w] = True
        local = img[y : y + h, x : x + w].mean()
        ink = rng.uniform(0, 50) if local > 127 else rng.uniform(205, 255)
        colour = np.clip(ink + rng.normal(0, 8, size=3), 0, 255)
        alpha = (mask.astype(np.float32) / 255.0)[..., None]
        img[y : y + h, x : x + w] = img[y : y + h, x : x + w] * (1 - alpha) + colour * alpha
        x0, y0, x1, y1 = x - 1, y - 1, x + w, y + h
        polys.append(np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32))
        if len(polys) >= max_words:
            break
    return np.clip(img, 0, 255).astype(np.uint8), polys


def normalize_image(image: np.ndarray) -> np.ndarray:
    """uint8 HWC -> float32 CHW, scaled by 1/255 and ImageNet mean/std (PaddleOCR's NormalizeImage)."""
    return normalize_chw(image)


def make_sample(rng: np.random.Generator, size: int = 128) -> dict:
    """One training sample with PaddleOCR's KeepKeys fields plus ``polys`` (the labels, for evaluation)."""
    image, polys = synth_text_image(rng, size)
    threshold_map, threshold_mask = make_border_map(polys, size, size)
    shrink_map, shrink_mask = make_shrink_map(polys, size, size)
    return {
        "image": normalize_image(image),
        "threshold_map": threshold_map,
        "threshold_mask": threshold_mask,
        "shrink_map": shrink_map,
        "shrink_mask": shrink_mask,
        "polys": polys,
        "raw": image,
    }


KEEP_KEYS = ("image", "threshold_map", "threshold_mask", "shrink_map", "shrink_mask")


def make_batch(seed: int, index: int, batch_size: int = 8, size: int = 128, *, stream: int = TRAIN_STREAM) -> dict:
    """Stacked numpy arrays for the five KeepKeys fields, plus ``polys`` (list per image)."""
    samples = [make_sample(sample_rng(seed, stream, index, item), size) for item in range(batch_size)]
    batch = {key: np.stack([s[key] for s in samples]) for key in KEEP_KEYS}
    batch["polys"] = [s["polys"] for s in samples]
    return batch
