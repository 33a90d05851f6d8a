"""ampsafe: make mixed-precision training safe for the models people actually train.

One entry point per job, for PyTorch and PaddlePaddle alike (the framework is read off the model)::

    report = ampsafe.scan(model, example_inputs)      # which conv/matmul paths overflow float16, and where
    ampsafe.patch(model, example_inputs)              # FP32 islands / ConvBN / exact range shifts, in place
    ampsafe.patch(model, example_inputs, policy=ampsafe.Island())   # a typed policy config ("island" for short)
    scaler = ampsafe.torch.GradScaler(min_scale=1.0)  # or ampsafe.paddle.GradScaler: a scaler with a floor
    with ampsafe.watch(model):                        # names the op, pass and sample of the first NaN/Inf
        ...

``import ampsafe`` imports neither framework; everything framework-specific loads on first use.
"""

from __future__ import annotations

import importlib

from . import errors
from .core.report import PatchReport, RiskOp, RiskPath, ScanReport
from .errors import *  # noqa: F403 (every exception is public at the top: errors.__all__)
from .healing import fronts as _healing_fronts

__version__ = "0.1.0"

__all__ = [  # noqa: F405 (the functions and policies load on first use, see __getattr__)
    "scan",
    "patch",
    "unpatch",
    "watch",
    "heal",
    "check_targets",
    "Auto",
    "Island",
    "ConvBN",
    "Rescale",
    "Rewrite",
    "ScanReport",
    "PatchReport",
    "RiskPath",
    "RiskOp",
    *errors.__all__,
]

# public name -> (module, attribute); loaded on first access so that `import ampsafe` stays light.
_LAZY = {
    "scan": ("ampsafe.scanner", "scan"),
    "patch": ("ampsafe.patching", "patch"),
    "unpatch": ("ampsafe.patching", "unpatch"),
    "watch": ("ampsafe.sentinel", "watch"),
    "heal": ("ampsafe.healing", "heal"),
    "check_targets": ("ampsafe.core.targets", "check_targets"),
    "Auto": ("ampsafe.policies.auto", "Auto"),
    "Island": ("ampsafe.policies.island", "Island"),
    "ConvBN": ("ampsafe.policies.convbn", "ConvBN"),
    "Rescale": ("ampsafe.policies.rescale", "Rescale"),
    "Rewrite": ("ampsafe.policies.rewrite", "Rewrite"),
}
_SUBPACKAGES = {"torch", "paddle", "workloads", "patches", "core", "policies"}


def _heal_fronts():
    """What a heal calls above its layer (``ampsafe.healing`` never imports the front): scan, then patch."""
    from .patching import patch
    from .scanner import scan

    return scan, patch


_healing_fronts.wire(_heal_fronts)


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"ampsafe.{name}")
    raise AttributeError(f"module 'ampsafe' has no attribute {name!r}")
