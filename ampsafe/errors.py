"""Exceptions. Every error ampsafe raises is an :class:`AmpSafeError`, so callers can catch one type."""

from __future__ import annotations

__all__ = [
    "AmpSafeError",
    "LossScaleFloorError",
    "NonFiniteError",
    "BadTargetError",
    "UnsupportedModelError",
    "ConfigError",
    "MissingFrameworkError",
]


class AmpSafeError(Exception):
    """Base class of every ampsafe error."""


class UnsupportedModelError(AmpSafeError, TypeError):
    """The object is not a model ampsafe can work on (neither ``torch.nn.Module`` nor ``paddle.nn.Layer``),
    or an operation is refused for this model (the message says why and what to do instead)."""


class MissingFrameworkError(AmpSafeError, ImportError):
    """A call needs a framework that is not installed; the message names the package to install."""


class ConfigError(AmpSafeError, ValueError):
    """A config file or section is missing, malformed or not supported; nothing was written."""


class BadTargetError(AmpSafeError, ValueError):
    """Detection targets are invalid (degenerate, non-finite, out of image or out of class range).

    Attributes: ``sample`` (batch index), ``box`` (box index or None), ``values``, ``reason``.
    """

    def __init__(self, message: str, *, sample=None, box=None, values=None, reason: str = ""):
        super().__init__(message)
        self.sample = sample
        self.box = box
        self.values = values
        self.reason = reason


class NonFiniteError(AmpSafeError, FloatingPointError):
    """The first non-finite value of a pass, with its origin.

    ``phase`` ("forward"/"backward"), ``module`` (path of the module whose forward ran the origin op, "" for
    the root), ``op`` (e.g. "conv2d", "log"), ``kind`` ("overflow": finite in float32, non-finite in low
    precision; "numerical": non-finite in float32 too; "input": the data was already non-finite),
    ``sample`` (batch index when known), ``stats`` (abs-max/min of the op's inputs and outputs).
    """

    def __init__(self, message: str, *, phase: str, module: str, op: str, kind: str, sample=None, stats=None):
        super().__init__(message)
        self.phase = phase
        self.module = module
        self.op = op
        self.kind = kind
        self.sample = sample
        self.stats = stats or {}


class LossScaleFloorError(AmpSafeError, FloatingPointError):
    """The loss scale reached its floor and overflow persisted.

    ``offenders``: parameter names (with their modules) whose gradients were non-finite on the last steps;
    ``scale_history``: recent scales; ``scale_independent``: True when the overflow is in the loss or the
    forward activations, which no loss scale can fix.
    """

    def __init__(self, message: str, *, offenders=(), scale_history=(), scale_independent=None):
        super().__init__(message)
        self.offenders = list(offenders)
        self.scale_history = list(scale_history)
        self.scale_independent = scale_independent
