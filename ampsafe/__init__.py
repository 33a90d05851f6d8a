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

from . import errors
from ._lazy import lazy_attributes
from .core.scan_report import PatchReport, RiskOp, RiskPath, ScanReport
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

# public name -> the module that defines it; loaded on first access so that `import ampsafe` stays light.
_LAZY = {
    "scan": ".scanner",
    "patch": ".patching",
    "unpatch": ".patching",
    "watch": ".sentinel",
    "heal": ".healing",
    "check_targets": ".core.targets",
    "Auto": ".policies.auto",
    "Island": ".policies.island",
    "ConvBN": ".policies.convbn",
    "Rescale": ".policies.rescale",
    "Rewrite": ".policies.rewrite",
}
_SUBPACKAGES = ("torch", "paddle", "patches", "core", "policies", "deepspeed")


def _heal_fronts():
    """What a heal calls above its layer (``ampsafe.healing`` never imports the front): scan, then patch."""
    from .patching import patch
    from .scanner import scan

    return scan, patch


_healing_fronts.wire(_heal_fronts)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, submodules=_SUBPACKAGES)
