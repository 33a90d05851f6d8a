"""What a heal's look at the last batch proves: bad data, a numerical error, or float16 range.

Why apart from the healer: these are the facts the heal decides on, each measured on the model's Backend
(model state put back), so the verdicts read the same for torch and Paddle and can be tested on their own.
The float32 facts come from the heal's one scan of the batch (:class:`ScanProbe` watches the scan's float32
forward), not from replays of their own.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..core.backend import FLOAT32
from ..core.model import call

__all__ = ["nonfinite_sample", "restore_scale", "repair_running_stats", "ScanProbe", "float32_replay"]


_NEVER_NONFINITE = np.zeros(0, np.float32)


def _to_numpy(x, backend) -> Optional[np.ndarray]:
    if isinstance(x, np.ndarray):
        return x if np.issubdtype(x.dtype, np.floating) else None
    if backend is not None and isinstance(x, backend.tensors.tensor_type):
        a = backend.tensors.to_numpy(x)
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
    """(input index, batch index) of the first non-finite value in the model's inputs, or None. ``backend``: the
    model's Backend, whose tensors are read too (without it, only NumPy arrays are)."""
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
        if backend.tensors.finite(mean) and backend.tensors.finite(var):
            continue
        backend.reset_running_stats(mean, var)
        repaired.append(path)
    return repaired


def _abs_max(backend, output) -> Optional[float]:
    seen = [
        float(np.nanmax(np.abs(a)))
        for a in map(backend.tensors.to_numpy, backend.tensors.leaves(output))
        if a is not None and a.size
    ]
    return max(seen) if seen else None


class ScanProbe:
    """What the heal's scan shows besides its paths: whether the model's float32 output (and loss) is finite, and
    the float32 magnitude of one module's output (a forward verdict's module). Hooks on the model while the scan's
    forward runs, so the batch is not run again for these facts.

    ``wrap(loss_fn)``: the loss function to hand the scan when it measures the backward (the loss it computes is
    the one checked). Without it, ``loss_fn`` is applied to the kept output in float32 after the scan.
    """

    def __init__(self, backend, model, module: Optional[str] = None):
        self.backend, self.output, self.loss = backend, None, None
        self.magnitudes: list[float] = []
        self._handles = [backend.forward_hook(model, self._keep_output)]
        target = backend.modules(model).get(module) if module is not None else None
        if target is not None:
            self._handles.append(backend.forward_hook(target, self._keep_magnitude))

    def _keep_output(self, output) -> None:
        self.output = output

    def _keep_magnitude(self, output) -> None:
        # measured now: an in-place op after the module (a ReLU) would change the output it returned
        amax = _abs_max(self.backend, output)
        if amax is not None:
            self.magnitudes.append(amax)

    def wrap(self, loss_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def loss_of(output):
            self.loss = loss_fn(output)
            return self.loss

        return loss_of

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def magnitude(self) -> Optional[float]:
        """max |output| of the module over its calls in the scan (None: not measured)."""
        return max(self.magnitudes) if self.magnitudes else None

    def nonfinite(self, loss_fn: Optional[Callable[[Any], Any]]) -> Optional[str]:
        """What was non-finite in float32 ("the model's output" / "the loss"), or None when it was finite."""
        if self.output is None:
            return None
        if any(not np.isfinite(a).all() for a in _arrays(self.output, self.backend)):
            return "the model's output"
        loss = self.loss
        if loss is None and loss_fn is not None:
            with self.backend.amp.float32():
                loss = loss_fn(self.output)
        if loss is not None and any(not np.isfinite(a).all() for a in _arrays(loss, self.backend)):
            return "the loss"
        return None


def float32_replay(
    backend, model, inputs, loss_fn, module: Optional[str] = None
) -> tuple[Optional[str], Optional[float]]:
    """Run ``model`` on ``inputs`` in float32 (no autocast, no emulation, no grad, model state put back).

    Returns (what was non-finite: "the model's output" / "the loss", or None) and the float32 max |output| of
    ``module`` (None when not asked for). Only when a scan saw a non-finite value: the scan runs in float32 (Paddle's
    tracer pauses the float16 emulation), unless the caller left the framework's own AMP on around it, so this run
    tells a numerical error (non-finite here too) from a float16 one.
    """
    probe = ScanProbe(backend, model, module)
    try:
        with backend.replay(model, FLOAT32):
            call(model, inputs)
            return probe.nonfinite(loss_fn), probe.magnitude
    finally:
        probe.remove()
