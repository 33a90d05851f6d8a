"""PyTorch adapter: tracer, GradScaler, patches and sentinel for ``torch.nn.Module`` models."""

from __future__ import annotations

from .._lazy import lazy_attributes
from ..core.model import register_wrappers

# The data-parallel wrappers that keep the model as ``.module`` (``TorchBackend.wrappers``), known to
# ``core.model.unwrap`` as soon as any module of this package is imported
WRAPPERS = {"module": frozenset({"DistributedDataParallel", "DataParallel"})}
register_wrappers(WRAPPERS)

# public name -> the submodule that defines it, loaded on first access
_LAZY = {
    "GradScaler": ".scaler",
    "module_stack": ".modstack",
    "current_module": ".modstack",
    "autocast_fp16_ops": ".ops",
}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
