"""Detection-target checks: catch the box that turns a loss into NaN before any loss is computed.

A NaN coordinate passes torchvision's degenerate-box assert silently and ends as ``loss_box_reg = nan``;
ppdet's ``Gt2YoloTarget`` silently drops zero/negative/NaN-width boxes, crashes on a NaN centre and turns a
1e-30-wide box into a log-width target of -65. :func:`check_targets` names each of these (sample, box index,
values, reason). Arrays are read through ``np.asarray`` so numpy, torch and paddle all work without this
module importing a framework.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import BadTargetError, ConfigError

__all__ = ["check_targets", "find_bad_boxes", "checked", "enforce", "BadBox", "CheckedCollate", "CheckedDataset"]

log = logging.getLogger("ampsafe.targets")

BOX_KEYS = ("boxes", "gt_bbox")
CLASS_KEYS = ("labels", "gt_class")
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
MIN_SIZE_ABSOLUTE = 1e-2  # pixels: a box a hundredth of a pixel wide is an annotation error
MIN_SIZE_NORMALIZED = 1e-5  # fraction of the image: the same at a 1000-pixel image


@dataclass
class BadBox:
    """One invalid box: batch ``sample``, ``box`` index (None for a whole-target problem), ``values``, ``reason``."""

    sample: int
    box: int | None
    values: tuple
    reason: str

    def describe(self) -> str:
        where = f"sample {self.sample}" + ("" if self.box is None else f", box {self.box}")
        vals = "" if not self.values else " " + "[" + ", ".join(_fmt(v) for v in self.values) + "]"
        return f"{where}:{vals} {self.reason}"


def _fmt(v) -> str:
    try:
        return format(float(v), ".6g")
    except (TypeError, ValueError):
        return str(v)


def to_numpy(x) -> np.ndarray:
    """numpy view of a numpy / torch / paddle array (detached, on the host) without importing a framework."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensors that require grad refuse np.asarray
        x = x.detach().cpu()
    if hasattr(x, "numpy") and not isinstance(x, (list, tuple)):
        try:
            return np.asarray(x.numpy())
        except (TypeError, RuntimeError):
            pass
    return np.asarray(x)


def _box_key(target: dict) -> str | None:
    return next((k for k in BOX_KEYS if k in target), None)


def _class_key(target: dict) -> str | None:
    return next((k for k in CLASS_KEYS if k in target), None)


def _image_hw(target: dict, image_size, sample: int):
    """(height, width) for a sample: the argument, else ppdet's ``im_shape`` / ``image`` (CHW), else None."""
    if image_size is not None:
        size = image_size[sample] if isinstance(image_size, (list, tuple)) and np.ndim(image_size[0]) else image_size
        h, w = (size, size) if np.ndim(size) == 0 else tuple(size)[-2:]
        return float(h), float(w)
    if "im_shape" in target:
        shape = to_numpy(target["im_shape"]).reshape(-1)
        return float(shape[0]), float(shape[1])
    if "image" in target and hasattr(target["image"], "shape") and len(target["image"].shape) == 3:
        shape = tuple(target["image"].shape)
        # CHW (after ppdet's Permute) or HWC (before): the channel axis is the short one
        return (float(shape[1]), float(shape[2])) if shape[0] <= 4 else (float(shape[0]), float(shape[1]))
    return None


def _to_xyxy(boxes: np.ndarray, box_format: str) -> np.ndarray:
    if box_format == "xyxy":
        return boxes
    if box_format == "xywh":
        x, y, w, h = boxes.T
        return np.stack([x, y, x + w, y + h], axis=1)
    cx, cy, w, h = boxes.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def _check_one(
    sample: int,
    boxes,
    classes,
    *,
    hw,
    num_classes,
    box_format: str,
    normalized,
    min_size,
    skip_padding: bool,
) -> list[BadBox]:
    raw = to_numpy(boxes).astype(np.float64, copy=False)
    if raw.size == 0:
        return []
    if raw.ndim != 2 or raw.shape[-1] != 4:
        return [BadBox(sample, None, (), f"boxes must have shape [N, 4], got {list(raw.shape)}")]
    finite_raw = raw[np.isfinite(raw).all(axis=1)]
    is_normalized = normalized
    if is_normalized is None:  # auto: every finite coordinate within [0, 1] (+ rounding)
        is_normalized = finite_raw.size > 0 and float(np.abs(finite_raw).max()) <= 1.0 + 1e-6
    if min_size is None:
        min_size = MIN_SIZE_NORMALIZED if is_normalized else MIN_SIZE_ABSOLUTE
    xyxy = _to_xyxy(raw, box_format)
    if box_format == "xyxy":
        width, height = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    else:  # the stored width/height, before x + w - x rounds a 1e-30 width to 0
        width, height = raw[:, 2], raw[:, 3]
    limit_w, limit_h = (1.0, 1.0) if is_normalized else (hw[1], hw[0]) if hw else (None, None)
    cls = None if classes is None else to_numpy(classes).reshape(-1)
    problems = []
    for i, row in enumerate(raw):
        values = tuple(float(v) for v in row)
        if skip_padding and not row.any():
            continue
        reason = None
        if not np.isfinite(row).all():
            bad = [name for name, v in zip(_coord_names(box_format), row) if not math.isfinite(v)]
            reason = f"non-finite coordinate ({', '.join(bad)})"
        elif width[i] <= 0 or height[i] <= 0:
            reason = f"degenerate box: width {_fmt(width[i])}, height {_fmt(height[i])} (must be > 0)"
        elif width[i] < min_size or height[i] < min_size:
            reason = (
                f"box too small: width {_fmt(width[i])}, height {_fmt(height[i])} below min_size {_fmt(min_size)}"
                " (its log-size regression target blows up, and it rounds to 0 in float16)"
            )
        elif limit_w is not None and (
            xyxy[i, 0] < -1e-6 * limit_w
            or xyxy[i, 1] < -1e-6 * limit_h
            or xyxy[i, 2] > limit_w * (1 + 1e-6)
            or xyxy[i, 3] > limit_h * (1 + 1e-6)
        ):
            space = "normalized [0, 1]" if is_normalized else f"image of {int(limit_w)}x{int(limit_h)} (w x h)"
            reason = f"box outside the {space}"
        if reason is None and cls is not None and i < cls.size:
            c = cls[i]
            if not np.isfinite(c) or c < 0 or (num_classes is not None and c >= num_classes):
                reason = f"class id {_fmt(c)} out of range [0, {num_classes})"
        if reason is not None:
            problems.append(BadBox(sample, i, values, reason))
    return problems


def _coord_names(box_format: str) -> tuple[str, ...]:
    return {"xyxy": ("x1", "y1", "x2", "y2"), "xywh": ("x", "y", "w", "h"), "cxcywh": ("cx", "cy", "w", "h")}[
        box_format
    ]


def _as_target_list(targets) -> tuple[list[dict], bool]:
    """A list of per-sample target dicts, and whether it came from a batched (padded) ppdet dict."""
    if isinstance(targets, dict):
        key = _box_key(targets)
        if key is None:
            raise ConfigError(f"a target dict needs one of {BOX_KEYS}; got keys {sorted(targets)}")
        boxes = targets[key]
        if len(boxes.shape) == 3:  # ppdet batch: gt_bbox [B, N, 4] padded with zero rows
            per = []
            for b in range(boxes.shape[0]):
                per.append({k: v[b] for k, v in targets.items() if hasattr(v, "shape") and len(v.shape) >= 1})
            return per, True
        return [targets], False
    if isinstance(targets, (list, tuple)) and all(isinstance(t, dict) for t in targets):
        return list(targets), False
    raise ConfigError(
        "check_targets expects a list of target dicts (torchvision: 'boxes', 'labels'; ppdet: 'gt_bbox', "
        f"'gt_class') or one ppdet batch dict, got {type(targets).__name__}"
    )


def find_bad_boxes(
    targets,
    *,
    image_size=None,
    num_classes: int | None = None,
    box_format: str | None = None,
    normalized: bool | None = None,
    min_size: float | None = None,
    padded: bool | None = None,
) -> list[BadBox]:
    """Every invalid box in ``targets`` (see :func:`check_targets`), in sample then box order."""
    items, batched = _as_target_list(targets)
    skip_padding = batched if padded is None else bool(padded)
    problems: list[BadBox] = []
    for s, target in enumerate(items):
        key = _box_key(target)
        if key is None:
            raise ConfigError(f"target of sample {s} has none of {BOX_KEYS}; keys: {sorted(target)}")
        fmt = box_format or "xyxy"
        if fmt not in BOX_FORMATS:
            raise ConfigError(f"box_format must be one of {BOX_FORMATS}, got {fmt!r}")
        ck = _class_key(target)
        problems += _check_one(
            s,
            target[key],
            None if ck is None else target[ck],
            hw=_image_hw(target, image_size, s),
            num_classes=num_classes,
            box_format=fmt,
            normalized=normalized,
            min_size=min_size,
            skip_padding=skip_padding,
        )
    return problems


def check_targets(targets, **options) -> None:
    """Raise :class:`ampsafe.BadTargetError` on the first invalid box, naming sample, box, values and reason.

    ``targets``: torchvision style (list of dicts with ``boxes`` [N, 4] and ``labels``) or ppdet style (dicts
    with ``gt_bbox`` and ``gt_class``; or one batch dict with ``gt_bbox`` [B, N, 4], whose all-zero rows are
    padding). ``box_format``: ``"xyxy"`` (default; torchvision and ppdet's loaders), ``"xywh"`` or
    ``"cxcywh"`` (ppdet after ``BboxXYXY2XYWH``, as ``Gt2YoloTarget`` reads it). ``normalized``: coordinates
    are fractions of the image; None guesses it (all coordinates within [0, 1]). ``image_size``: (h, w), one
    per sample, or None (ppdet's ``im_shape`` / ``image`` are used when present); boxes outside it are bad.
    ``min_size``: smallest valid width/height (default 0.01 pixel, or 1e-5 of the image when normalized).
    Checked: NaN/inf coordinates, width or height <= 0 or below ``min_size``, boxes outside the image, class
    ids outside [0, num_classes). ``padded``: all-zero rows are padding (ppdet's ``PadBox`` pads each sample's
    ``gt_bbox`` with them, and its target builders skip them); None: only in a batch dict. These ``options`` are
    :func:`find_bad_boxes`'s keywords (it refuses any other).
    """
    problems = find_bad_boxes(targets, **options)
    if problems:
        first = problems[0]
        more = (
            ""
            if len(problems) == 1
            else f" ({len(problems) - 1} more: "
            + "; ".join(p.describe() for p in problems[1:4])
            + ("; ..." if len(problems) > 4 else "")
            + ")"
        )
        raise BadTargetError(
            f"bad detection target: {first.describe()}{more}. Fix or drop the annotation (ampsafe.core.targets."
            "checked(..., policy='drop') drops bad boxes with a warning); left in, it gives loss = nan or a "
            "silently ignored box.",
            sample=first.sample,
            box=first.box,
            values=first.values,
            reason=first.reason,
        )


def _drop_rows(target: dict, bad: set[int], batched: bool) -> None:
    """Remove rows ``bad`` from every per-box field of a target dict (in batched ppdet form: make them padding)."""
    key = _box_key(target)
    n = int(target[key].shape[0])
    keep = np.asarray([i for i in range(n) if i not in bad], dtype=np.int64)
    for k, v in list(target.items()):
        if hasattr(v, "shape") and len(v.shape) >= 1 and int(v.shape[0]) == n and k not in ("image", "im_shape"):
            target[k] = v[keep]


def _zero_sample_rows(target: dict, bad: set[int]) -> None:
    key = _box_key(target)
    n = int(target[key].shape[0])
    for k, v in target.items():
        if hasattr(v, "shape") and len(v.shape) >= 1 and int(v.shape[0]) == n and k not in ("image", "im_shape"):
            for i in bad:
                v[i] = 0


def _zero_rows(batch: dict, sample: int, bad: set[int]) -> None:
    key = _box_key(batch)
    n = int(batch[key].shape[1])
    for k, v in batch.items():
        if hasattr(v, "shape") and len(v.shape) >= 2 and int(v.shape[1]) == n and k not in ("image", "im_shape"):
            for i in bad:
                v[sample, i] = 0


def _locate_targets(obj, depth: int = 0):
    """Find the targets in a collated batch or a dataset item: a target dict, a list of them, or None."""
    if isinstance(obj, dict) and _box_key(obj) is not None:
        return obj
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(t, dict) and _box_key(t) for t in obj):
        return obj
    if depth < 2 and isinstance(obj, (list, tuple)):
        for item in obj:
            found = _locate_targets(item, depth + 1)
            if found is not None:
                return found
    return None


def enforce(targets, policy: str = "raise", *, sample_offset: int = 0, **check_kwargs) -> list[BadBox]:
    """Check ``targets`` (what :func:`check_targets` takes) and apply ``policy`` in place; returns the bad boxes.

    ``"raise"``: :class:`ampsafe.BadTargetError` on the first one. ``"drop"``: each bad box and every per-box
    field of its target (labels, areas, ...) is removed, with a warning naming ``sample + sample_offset``; in a
    padded ppdet batch dict the bad rows become padding. Nothing bad: nothing changes, ``[]``.
    """
    if policy not in ("raise", "drop"):
        raise ConfigError(f"policy must be 'raise' or 'drop', got {policy!r}")
    problems = find_bad_boxes(targets, **check_kwargs)
    if problems:
        _apply_to(targets, problems, policy, sample_offset, check_kwargs)
    return problems


def _apply(obj, policy: str, sample_offset: int, check_kwargs: dict):
    targets = _locate_targets(obj)
    if targets is None:
        return obj
    problems = find_bad_boxes(targets, **check_kwargs)
    if problems:
        _apply_to(targets, problems, policy, sample_offset, check_kwargs)
    return obj


def _apply_to(targets, problems: list[BadBox], policy: str, sample_offset: int, check_kwargs: dict) -> None:
    if policy == "raise":
        check_targets(targets, **check_kwargs)
    items, batched = _as_target_list(targets)
    by_sample: dict[int, set[int]] = {}
    for p in problems:
        by_sample.setdefault(p.sample, set()).add(p.box)
    for p in problems:
        msg = f"ampsafe: dropped bad box (sample {p.sample + sample_offset}): {p.describe()}"
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
    if batched:
        for s, bad in by_sample.items():
            _zero_rows(targets, s, {b for b in bad if b is not None})
    elif check_kwargs.get("padded"):  # padded samples keep their shape: the bad rows become padding
        for s, bad in by_sample.items():
            _zero_sample_rows(items[s], {b for b in bad if b is not None})
    else:
        for s, bad in by_sample.items():
            _drop_rows(items[s], {b for b in bad if b is not None}, batched)


class CheckedCollate:
    """A collate function that checks the targets of every batch it builds (see :func:`checked`)."""

    def __init__(self, collate_fn: Callable, policy: str, check_kwargs: dict):
        self.collate_fn, self.policy, self.check_kwargs = collate_fn, policy, check_kwargs

    def __call__(self, batch):
        return _apply(self.collate_fn(batch), self.policy, 0, self.check_kwargs)


class CheckedDataset:
    """A dataset view whose items' targets are checked (see :func:`checked`); sample = dataset index."""

    def __init__(self, dataset, policy: str, check_kwargs: dict):
        self.dataset, self.policy, self.check_kwargs = dataset, policy, check_kwargs

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        item = self.dataset[index]
        try:
            return _apply(item, self.policy, index, self.check_kwargs)
        except BadTargetError as exc:
            exc.sample = index
            exc.args = (f"dataset index {index}: {exc.args[0]}",)
            raise

    def __getattr__(self, name):  # everything else (transforms, coco api, ...) from the wrapped dataset
        return getattr(self.dataset, name)


def checked(collate_fn_or_dataset: Any, policy: str = "raise", **check_kwargs):
    """Wrap a collate function or a dataset so that every batch's (item's) targets are checked.

    ``policy="raise"``: :class:`ampsafe.BadTargetError` on the first bad box. ``policy="drop"``: remove bad
    boxes (and their labels, areas, ... : every per-box field) with a warning, and go on; in a padded ppdet
    batch dict the bad rows become padding. ``check_kwargs`` go to :func:`check_targets`. A dataset (has
    ``__getitem__`` and ``__len__``) is wrapped per item, with the dataset index as the sample; anything else
    callable is a collate function.
    """
    if policy not in ("raise", "drop"):
        raise ConfigError(f"policy must be 'raise' or 'drop', got {policy!r}")
    if hasattr(collate_fn_or_dataset, "__getitem__") and hasattr(collate_fn_or_dataset, "__len__"):
        return CheckedDataset(collate_fn_or_dataset, policy, check_kwargs)
    if callable(collate_fn_or_dataset):
        return CheckedCollate(collate_fn_or_dataset, policy, check_kwargs)
    raise ConfigError(f"checked() wraps a collate function or a dataset, got {type(collate_fn_or_dataset).__name__}")
