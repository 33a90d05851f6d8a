"""PyTorch adapter: tracer, GradScaler, patches and sentinel for ``torch.nn.Module`` models."""

from __future__ import annotations

import importlib as _importlib

# public name -> defining module; loaded on first access (others: add your names here, one line each)
_LAZY = {
    "GradScaler": "ampsafe.torch.scaler",
    "module_stack": "ampsafe.torch.modstack",
    "current_module": "ampsafe.torch.modstack",
    "autocast_fp16_ops": "ampsafe.torch.ops",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
