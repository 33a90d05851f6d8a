"""``ampsafe run``'s target checks: detection boxes are checked before the model (or ppdet's target builder)
sees them, and a bad one is named (sample, box, values, reason) or dropped (``--on-bad-target raise|drop``).

Where, and why there:

* torchvision's ``GeneralizedRCNN.forward`` (Faster / Mask / Keypoint R-CNN): its own check is an assert after
  the transform that names no sample, and a NaN box passes it and ends as ``loss_box_reg = nan``;
* ppdet's batch transforms that turn ``gt_bbox`` into targets (``Gt2YoloTarget``, ``Gt2FCOSTarget``, ...):
  ``Gt2YoloTarget`` silently drops a zero-width box and crashes on a NaN centre. They are checked as they read
  the boxes (``Gt2YoloTarget``: normalized centre-x, centre-y, width, height).

The checks are :func:`ampsafe.core.targets.enforce`; each hook counts what it saw for the run summary
(:func:`stats`). Framework-neutral: the boxes are read through numpy.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from ..core.targets import enforce
from ..errors import BadTargetError

__all__ = ["TargetHook", "patch_torchvision", "patch_ppdet", "stats"]

# ppdet batch transforms that read gt_bbox, and the box format they read it in (ppdet 2.6.0's sources)
PPDET_BATCH_TRANSFORMS = {
    "Gt2YoloTarget": "cxcywh",  # after BboxXYXY2XYWH + NormalizeBox: gx, gy, gw, gh
    "Gt2FCOSTarget": "xyxy",
    "Gt2GFLTarget": "xyxy",
    "Gt2TTFTarget": "xyxy",
    "Gt2Solov2Target": "xyxy",
    "Gt2CenterNetTarget": "xyxy",
}

_lock = threading.Lock()
_hooks: list[TargetHook] = []


class TargetHook:
    """One checked entry point: its policy and what it found (batches checked, bad boxes, the first one)."""

    def __init__(self, where: str, policy: str):
        self.where, self.policy = where, policy
        self.calls = 0
        self.bad_boxes = 0
        self.first: str | None = None
        with _lock:
            _hooks.append(self)

    def check(self, targets, **check_kwargs) -> None:
        self.calls += 1
        try:
            problems = enforce(targets, self.policy, **check_kwargs)
        except BadTargetError as exc:
            self.bad_boxes += 1
            self.first = self.first or f"sample {exc.sample}, box {exc.box}: {exc.reason}"
            exc.args = (
                f"{self.where}: {exc.args[0]} (checked by ampsafe run before the model saw it; "
                "`ampsafe run --on-bad-target drop` drops such boxes with a warning and goes on)",
            )
            raise
        if problems:
            self.bad_boxes += len(problems)
            self.first = self.first or problems[0].describe()

    def to_dict(self) -> dict:
        return {
            "where": self.where,
            "policy": self.policy,
            "calls": self.calls,
            "bad_boxes": self.bad_boxes,
            "first": self.first,
        }


def stats() -> list[dict]:
    """What every hook saw (for the run summary)."""
    with _lock:
        return [h.to_dict() for h in _hooks]


def _wrap(owner, attr: str, make: Callable[[Callable], Callable], setter: Callable) -> None:
    original = getattr(owner, attr)
    if getattr(original, "__ampsafe_targets__", False):
        return
    wrapped = functools.wraps(original)(make(original))
    wrapped.__ampsafe_targets__ = True
    setter(owner, attr, wrapped)


def patch_torchvision(generalized_rcnn_module, policy: str, setter: Callable) -> str:
    """Check ``targets`` at every training ``GeneralizedRCNN.forward`` (image sizes from ``images``)."""
    cls = generalized_rcnn_module.GeneralizedRCNN
    hook = TargetHook("torchvision GeneralizedRCNN targets", policy)

    def make(original):
        def forward(self, images, targets=None, *args: Any, **kwargs: Any):
            if targets is not None and self.training:
                sizes = [tuple(img.shape[-2:]) for img in images] if isinstance(images, (list, tuple)) else None
                hook.check(targets, image_size=sizes)
            return original(self, images, targets, *args, **kwargs)

        return forward

    _wrap(cls, "forward", make, setter)
    return f"torchvision GeneralizedRCNN.forward: targets checked first (on_bad_target={policy!r})"


def patch_ppdet(batch_operators, policy: str, setter: Callable) -> str:
    """Check ``gt_bbox`` where each of ppdet's target-building batch transforms would read it."""
    names = []
    for name, box_format in PPDET_BATCH_TRANSFORMS.items():
        cls = getattr(batch_operators, name, None)
        if cls is None:
            continue
        hook = TargetHook(f"ppdet {name}", policy)

        def make(original, _hook=hook, _format=box_format):
            def __call__(self, samples, context=None, *args: Any, **kwargs: Any):
                items = samples if isinstance(samples, (list, tuple)) else [samples]
                items = [s for s in items if isinstance(s, dict) and "gt_bbox" in s]
                if items:
                    _hook.check(items, box_format=_format, padded=True)  # PadBox's zero rows are padding
                return original(self, samples, context, *args, **kwargs)

            return __call__

        _wrap(cls, "__call__", make, setter)
        names.append(name)
    return f"ppdet {', '.join(names)}: gt_bbox checked first (on_bad_target={policy!r})"
