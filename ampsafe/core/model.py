"""The user's model as every layer meets it: looked up through its data-parallel wrappers, called on its inputs.

Why in core: the tracer, the heal, the emulators and the fronts all unwrap a model and call it on
``example_inputs``; written once here, below all of them, no caller needs the framework registry for it.
The heal's swallowed-overflow rule and the report's line trials both replay a batch to find the first module
whose output is non-finite: :func:`first_nonfinite`, over the Backend they pass in. A forward the scalers captured
as ``(args, kwargs)`` becomes ``example_inputs`` again by :func:`ampsafe.core.capture.example_inputs`.
Pure Python: importing it imports neither torch nor paddle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Optional

__all__ = ["call", "first_nonfinite", "unwrap", "register_wrappers"]

# attribute -> the class names of the wrappers that keep the model there, as each Backend class names them
_WRAPPERS: dict[str, set[str]] = {}


def register_wrappers(wrappers) -> None:
    """Look through ``wrappers`` (a Backend's ``wrappers``: attribute -> class names) from now on."""
    for attr, names in wrappers.items():
        _WRAPPERS.setdefault(attr, set()).update(names)


def unwrap(model):
    """The user's model inside its framework's data-parallel wrappers (``Backend.wrappers``: DDP and DataParallel
    keep it as ``.module`` in torch, Paddle's DataParallel and fleet's wrappers as ``._layers``)."""
    while True:
        for attr, wrappers in _WRAPPERS.items():
            inner = getattr(model, attr, None)
            if inner is not None and type(model).__name__ in wrappers:
                model = inner
                break
        else:
            return model


def call(model, example_inputs):
    """``model(*example_inputs)``, or ``model(**example_inputs)`` for a dict, as ``example_inputs`` is defined
    throughout the API."""
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)


@contextlib.contextmanager
def first_nonfinite_output(backend, modules: dict) -> Iterator[list[str]]:
    """A hook on every module of ``modules`` (path -> module; the root, path ``""``, left out) while the block runs:
    yields a list that holds, once a forward ran, the path of the first module whose output held an inf/NaN (empty
    while none did). The hooks are removed when the block ends, whatever it raised."""
    tensors = backend.tensors
    first: list[str] = []

    def hook(path: str):
        def check(output) -> None:
            if not first and not all(tensors.finite(t) for t in tensors.checkable_leaves(output)):
                first.append(path)

        return check

    handles = [backend.forward_hook(m, hook(p)) for p, m in modules.items() if p]
    try:
        yield first
    finally:
        for handle in handles:
            handle.remove()


def first_nonfinite(backend, model, forward: Callable[[], Any]) -> tuple[Optional[str], bool]:
    """Run ``forward()`` (one call of ``model``, in whatever precision context it opens) with a hook on every
    submodule: ``(path of the first module whose output holds an inf/NaN or None, whether the model's output is
    finite)``. The model's state (BatchNorm statistics and the like) and the random state are put back; an
    exception from the forward propagates."""
    with first_nonfinite_output(backend, backend.modules(model)) as first, backend.replay(model):
        out = forward()
    finite = all(backend.tensors.finite(t) for t in backend.tensors.checkable_leaves(out))
    return (first[0] if first else None), finite
