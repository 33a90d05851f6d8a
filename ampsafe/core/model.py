"""The user's model as every layer meets it: looked up through its data-parallel wrappers, called on its inputs.

Why in core: the tracer, the heal, the emulators and the fronts all unwrap a model and call it on
``example_inputs``; written once here, below all of them, no caller needs the framework registry for it.
The heal's swallowed-overflow rule and the report's line trials both replay a batch to find the first module
whose output is non-finite: :func:`first_nonfinite`, over the Backend they pass in. A forward the scalers captured
as ``(args, kwargs)`` becomes ``example_inputs`` again by :func:`scan_inputs`.
Pure Python: importing it imports neither torch nor paddle.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Optional

__all__ = ["call", "first_nonfinite", "scan_inputs", "unwrap"]

# Paddle fleet's meta-parallel wrappers (``fleet.distributed_model``) keep the model as ``._layers`` too
_FLEET = {"ShardingParallel", "TensorParallel", "SegmentParallel"}
_WRAPPERS = {"module": {"DistributedDataParallel", "DataParallel"}, "_layers": {"DataParallel"} | _FLEET}


def unwrap(model):
    """The user's model inside DDP / DataParallel / paddle.DataParallel / fleet wrappers (they keep it as
    ``.module`` in torch and ``._layers`` in Paddle)."""
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


def first_nonfinite(backend, model, forward: Callable[[], Any]) -> tuple[Optional[str], bool]:
    """Run ``forward()`` (one call of ``model``, in whatever precision context it opens) with a hook on every
    submodule: ``(path of the first module whose output holds an inf/NaN or None, whether the model's output is
    finite)``. The model's state (BatchNorm statistics and the like) and the random state are put back; an
    exception from the forward propagates."""
    tensors = backend.tensors
    first: list[str] = []

    def hook(path: str):
        def check(output) -> None:
            if not first and not all(tensors.finite(t) for t in tensors.checkable_leaves(output)):
                first.append(path)

        return check

    handles = [backend.forward_hook(m, hook(p)) for p, m in backend.modules(model).items() if p]
    restore, rng = backend.snapshot(model), backend.rng_state()
    try:
        out = forward()
        return (first[0] if first else None), all(tensors.finite(t) for t in tensors.checkable_leaves(out))
    finally:
        for handle in handles:
            handle.remove()
        restore()
        rng()


def scan_inputs(model, latest: tuple[tuple, dict]):
    """``ampsafe.scan``'s ``example_inputs`` for a captured forward ``(args, kwargs)``: the args, the kwargs (HF's
    ``model(**batch)``), or both as one dict named by ``model.forward``'s signature. ValueError when they cannot
    be named (a forward that takes ``*args``)."""
    args, kwargs = latest
    if not kwargs:
        return tuple(args)
    if not args:
        return dict(kwargs)
    try:
        signature = inspect.signature(unwrap(model).forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"positional and keyword inputs that the forward's signature cannot name: {exc}") from None
    named: dict = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            raise ValueError("positional inputs the forward takes as *args have no name for scan's dict")
        named.update(value if kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    return named
