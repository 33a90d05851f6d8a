"""``ampsafe run``'s target checks: detection boxes are checked before the model (or ppdet's target builder)
sees them, and a bad one is named (sample, box, values, reason) or dropped (``--on-bad-target raise|drop``).

Where is the framework's to say (its ``install_run``): torchvision's ``GeneralizedRCNN.forward``
(:mod:`ampsafe.torch.run`), ppdet's target-building batch transforms (:mod:`ampsafe.paddle.run`). Each such entry
point gets a :class:`TargetHook` from the run, which applies :func:`ampsafe.core.targets.enforce` with the run's
policy and counts what it saw for the run summary (:func:`stats`). Framework-neutral: the boxes are read through
numpy.
"""

from __future__ import annotations

import contextlib
import threading

from ..core.targets import enforce
from ..errors import BadTargetError

__all__ = ["TargetHook", "stats", "replaying"]

_lock = threading.Lock()
_hooks: list[TargetHook] = []
_replay = threading.local()  # .depth: inside a replay of a forward the script already ran


@contextlib.contextmanager
def replaying():
    """A replay of a forward the script already ran (the FP32 guard's, at the script's exit): its targets were
    counted when the script ran it, so the summary's counts stay the script's own (the check itself still runs)."""
    depth = getattr(_replay, "depth", 0)
    _replay.depth = depth + 1
    try:
        yield
    finally:
        _replay.depth = depth


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
        if getattr(_replay, "depth", 0):  # checked (and counted) when the script ran it; still never let through
            enforce(targets, self.policy, **check_kwargs)
            return
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
