"""The registry of framework backends: which framework a model belongs to, and friendly imports of the frameworks.

``import ampsafe`` must work with only one framework installed, so nothing here imports torch or paddle
at module import time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
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

    Each registered backend is asked whether the model is one of its modules; only frameworks that are
    already imported are consulted: a model of a framework cannot exist without it having been imported.
    """
    for backend in imported_backends():
        if isinstance(model, backend.module_type):
            return backend.name
    raise UnsupportedModelError(
        f"expected a torch.nn.Module or a paddle.nn.Layer, got {type(model).__module__}.{type(model).__name__}"
    )


def _torch_backend():
    from .torch import run
    from .torch.backend import BACKEND

    return BACKEND.with_run(run.install)


def _paddle_backend():
    from .paddle import run
    from .paddle.backend import BACKEND

    return BACKEND.with_run(run.install)


# The registry of backends: framework name (also its top-level module) -> the function that loads its Backend.
# A new framework is one package ``ampsafe/<name>/`` and one line here.
REGISTRY: dict[str, Callable[[], object]] = {TORCH: _torch_backend, PADDLE: _paddle_backend}


def backend_named(framework: str):
    """The :class:`~ampsafe.core.backend.Backend` of a registered framework (one instance each, cached)."""
    backend = _BACKENDS.get(framework)
    if backend is None:
        if framework not in REGISTRY:
            raise UnsupportedModelError(f"no ampsafe backend for {framework!r}; registered: {', '.join(REGISTRY)}")
        require(framework)
        backend = _BACKENDS[framework] = REGISTRY[framework]()
    return backend


def backend_of(model):
    """The :class:`~ampsafe.core.backend.Backend` of a model (DDP / DataParallel wrappers looked through)."""
    return backend_named(framework_of(model))  # a wrapper is a module of its framework too


def imported_backends() -> list:
    """The backends of the frameworks this process has already imported (none is imported here)."""
    return [backend_named(name) for name in REGISTRY if name in sys.modules]
