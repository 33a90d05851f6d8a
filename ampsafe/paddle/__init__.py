"""PaddlePaddle adapter: float16 emulator, tracer, GradScaler, patches and sentinel for ``paddle.nn.Layer`` models.

Names load lazily from their submodules (one line per owner in ``_LAZY``), so ``import ampsafe.paddle`` stays
cheap and a missing teammate module only fails when its name is used.
"""

from __future__ import annotations

from .._lazy import lazy_attributes
from ..core.model import register_wrappers

# Paddle's DataParallel and fleet's meta-parallel wrappers (``fleet.distributed_model``) keep the model as ``._layers``
# (``PaddleBackend.wrappers``), known to ``core.model.unwrap`` as soon as any module of this package is imported
WRAPPERS = {"_layers": frozenset({"DataParallel", "ShardingParallel", "TensorParallel", "SegmentParallel"})}
register_wrappers(WRAPPERS)

# public name -> the submodule that defines it
_LAZY = {
    "emulate_fp16": ".emulate",
    "Fp16Emulator": ".emulate",
    "fp16_op_types": ".amp_lists",
    "runs_in_fp16": ".amp_lists",
    "GradScaler": ".scaler",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
