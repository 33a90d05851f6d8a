"""Which framework a model belongs to, and lazy, friendly imports of the frameworks.

``import ampsafe`` must work with only one framework installed, so nothing here imports torch or paddle
at module import time.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from .errors import MissingFrameworkError, UnsupportedModelError

TORCH = "torch"
PADDLE = "paddle"

_BACKENDS: dict = {}

_INSTALL_HINT = {
    TORCH: "pip install torch (see https://pytorch.org for the CUDA build), or pip install 'ampsafe[torch]'",
    PADDLE: "install PaddlePaddle first: pip install paddlepaddle (CPU) or paddlepaddle-gpu from Paddle's own index",
}


def require(framework: str) -> ModuleType:
    """Import ``torch`` or ``paddle``, or raise :class:`MissingFrameworkError` saying what to install."""
    try:
        return importlib.import_module(framework)
    except ImportError as exc:
        raise MissingFrameworkError(
            f"this ampsafe call needs {framework!r}, which is not installed: {_INSTALL_HINT[framework]}"
        ) from exc


def framework_of(model) -> str:
    """Return ``"torch"`` or ``"paddle"`` for a model, looking through DDP/DataParallel wrappers.

    Only frameworks that are already imported are consulted: a model of a framework cannot exist
    without it having been imported.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return TORCH
    paddle = sys.modules.get("paddle")
    if paddle is not None and isinstance(model, paddle.nn.Layer):
        return PADDLE
    raise UnsupportedModelError(
        f"expected a torch.nn.Module or a paddle.nn.Layer, got {type(model).__module__}.{type(model).__name__}"
    )


def unwrap(model):
    """The user's model inside DDP / DataParallel / paddle.DataParallel wrappers (they keep it as ``.module``
    in torch and ``._layers`` in Paddle)."""
    while True:
        inner = getattr(model, "module", None)
        if inner is not None and type(model).__name__ in {"DistributedDataParallel", "DataParallel"}:
            model = inner
            continue
        inner = getattr(model, "_layers", None)
        if inner is not None and type(model).__name__ == "DataParallel":
            model = inner
            continue
        return model


def backend_named(framework: str):
    """The :class:`~ampsafe.core.backend.Backend` of ``"torch"`` or ``"paddle"`` (one instance each, cached)."""
    backend = _BACKENDS.get(framework)
    if backend is None:
        require(framework)
        backend = _BACKENDS[framework] = importlib.import_module(f"ampsafe.{framework}.backend").BACKEND
    return backend


def backend_of(model):
    """The :class:`~ampsafe.core.backend.Backend` of a model (DDP / DataParallel wrappers looked through)."""
    return backend_named(framework_of(unwrap(model)))


def imported_backends() -> list:
    """The backends of the frameworks this process has already imported (none is imported here)."""
    return [backend_named(name) for name in (TORCH, PADDLE) if name in sys.modules]


def call(model, example_inputs):
    """``model(*example_inputs)``, or ``model(**example_inputs)`` for a dict, as ``example_inputs`` is defined
    throughout the API."""
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)
