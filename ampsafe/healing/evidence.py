"""What a heal's replay of the last batch proves: bad data, a numerical error, or float16 range.

Why apart from the healer: these are the facts the heal decides on, each measured on the model's Backend
(float32 without autocast or emulation, model state put back), so the verdicts read the same for torch and
Paddle and can be tested on their own.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .._framework import call, imported_backends

__all__ = ["nonfinite_sample", "restore_scale", "float32_replay", "repair_running_stats"]


_NEVER_NONFINITE = np.zeros(0, np.float32)


def _to_numpy(x, backend) -> Optional[np.ndarray]:
    if isinstance(x, np.ndarray):
        return x if np.issubdtype(x.dtype, np.floating) else None
    backends = [backend] if backend is not None else imported_backends()
    for b in backends:
        if isinstance(x, b.tensor_type):
            a = b.to_numpy(x)
            return a if a is not None else _NEVER_NONFINITE  # an integer tensor still counts as an input
    return None


def _arrays(inputs, backend=None):
    """Every floating array in a nest of tuples, lists and dicts (framework tensors as float32 numpy)."""
    if isinstance(inputs, dict):
        for v in inputs.values():
            yield from _arrays(v, backend)
    elif isinstance(inputs, (list, tuple)):
        for v in inputs:
            yield from _arrays(v, backend)
    else:
        a = _to_numpy(inputs, backend)
        if a is not None:
            yield a


def nonfinite_sample(inputs, backend=None) -> Optional[tuple[int, int]]:
    """(input index, batch index) of the first non-finite value in the model's inputs, or None."""
    for i, a in enumerate(_arrays(inputs, backend)):
        bad = ~np.isfinite(a)
        if bad.any():
            return i, int(np.argwhere(bad)[0][0]) if a.ndim else 0
    return None


def restore_scale(history) -> Optional[float]:
    """The scale before the collapse: walk back over the recent scales while they do not decrease.

    The core's ``last_clean_scale`` is the scale of the last clean step, which during a collapse may already be
    the floor (an overflow that only the backward had stops at a small enough scale, then comes back).
    """
    hist = [float(s) for s in history]
    if not hist:
        return None
    i = len(hist) - 1
    while i > 0 and hist[i - 1] >= hist[i]:
        i -= 1
    return hist[i]


def repair_running_stats(backend, model) -> list[str]:
    """Reset the running statistics that the overflowing forwards made non-finite; returns their layers.

    A skipped step still ran its forward, and a train-mode BatchNorm after an overflowing conv folded inf/NaN
    into its running mean and variance: training (batch statistics) goes on, but eval would be NaN. They restart
    from their initial values (mean 0, variance 1) and re-converge at the layer's momentum.
    """
    repaired = []
    for path, _layer, mean, var in backend.running_stats(model):
        if backend.all_finite(mean) and backend.all_finite(var):
            continue
        backend.reset_running_stats(mean, var)
        repaired.append(path)
    return repaired


def float32_replay(backend, model, inputs, loss_fn: Optional[Callable[[Any], Any]]) -> Optional[str]:
    """Run ``model`` on ``inputs`` in float32 (no autocast, no emulation, no grad, model state put back).

    Returns what was non-finite ("the model's output" / "the loss"), or None when float32 is finite.
    """
    restore = backend.snapshot(model)
    with backend.float32():
        try:
            out = call(model, inputs)
            loss = loss_fn(out) if loss_fn is not None else None
        finally:
            restore()
    if any(not np.isfinite(a).all() for a in _arrays(out, backend)):
        return "the model's output"
    if loss is not None and any(not np.isfinite(a).all() for a in _arrays(loss, backend)):
        return "the loss"
    return None
