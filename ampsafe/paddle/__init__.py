"""PaddlePaddle adapter: float16 emulator, tracer, GradScaler, patches and sentinel for ``paddle.nn.Layer`` models.

Names load lazily from their submodules (one line per owner in ``_LAZY``), so ``import ampsafe.paddle`` stays
cheap and a missing teammate module only fails when its name is used.
"""

from __future__ import annotations

import importlib

# public name -> submodule of ampsafe.paddle that defines it
_LAZY = {
    "emulate_fp16": "emulate",
    "Fp16Emulator": "emulate",
    "fp16_op_types": "amp_lists",
    "runs_in_fp16": "amp_lists",
    "GradScaler": "scaler",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    submodule = _LAZY.get(name)
    if submodule is None:
        raise AttributeError(f"module 'ampsafe.paddle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value
