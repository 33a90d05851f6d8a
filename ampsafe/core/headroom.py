"""One model's float16 headroom, measured in its own forward: :class:`HeadroomMonitor`, and the threshold rule.

Why one monitor: ``ampsafe.watch(monitor_every=N)`` and ``ampsafe run``'s sampling need the same measurement (which
modules, forward hooks on the sampled steps only, a float32 abs-max kept on the device, one host sync per sample,
a series a long run can hold) and differ only in when they sample and what they warn about. The when stays with
the caller (the watch's forwards, the run's optimizer steps); the what is a rule called after each sample:
:class:`ThresholdRule` (the watch: a path below ``margin_bits``) here, the run's trend
(:mod:`ampsafe.run.headroom_trend`) beside its records. The scan that picks the modules is the caller's too (core
never imports the front end's ``ampsafe.scan``); the monitor reads its report. Pure Python.
"""

from __future__ import annotations

import math
import weakref
from contextlib import nullcontext
from typing import Any, Callable, Optional

from .sentinel import HeadroomWarning, headroom_warnings

__all__ = ["HeadroomMonitor", "ThresholdRule", "conv_or_linear", "keep_span", "KEPT_SAMPLES"]

KEPT_SAMPLES = 5000  # samples kept per series


def keep_span(points: list, point: tuple, limit: int = KEPT_SAMPLES) -> None:
    """Append; a full list first keeps every other point of its older half, so a long run keeps its whole span,
    densest where it is recent."""
    if len(points) >= limit:
        half = limit // 2
        points[:] = points[:half:2] + points[half:]
    points.append(point)


def conv_or_linear(module) -> bool:
    """The layers measured where no scan chose: convolutions and linear layers (HF's ``Conv1D`` included)."""
    name = type(module).__name__
    return ("Conv" in name or "Linear" in name) and "Transpose" not in name or name == "Conv1D"


def _in_training(module) -> bool:
    """An evaluation forward between steps is not the step's."""
    return getattr(module, "training", True)


class HeadroomMonitor:
    """The abs-max of chosen modules' outputs on the steps the caller arms: :meth:`arm` hooks them, :meth:`collect`
    reads them (one host sync), keeps them in :attr:`series` and runs the ``rules`` (``rule(monitor, step, amax)``).

    ``counts(module)``: whether a forward of the module counts (default: in training mode); ``quiet()``: a context
    entered while a hook computes (a watch that intercepts ops must not check the monitor's own); ``prefix()``: the
    model's path in the object the user holds, before each series' name. The model and its modules are held weakly.
    """

    def __init__(
        self,
        backend,
        model,
        *,
        rules: tuple = (),
        counts: Callable[[Any], bool] = _in_training,
        quiet: Callable[[], Any] = nullcontext,
        prefix: Callable[[], str] = lambda: "",
    ) -> None:
        self.backend = backend
        self._model = weakref.ref(model)
        self.rules = list(rules)
        self.counts, self.quiet, self.prefix = counts, quiet, prefix
        self.layers: dict[str, Any] = {}  # name -> weakref to the module
        self.paths: list[tuple[str, tuple]] = []  # (start, layers) of the unnormalized paths, once scanned
        self.how = ""  # how the modules were chosen ("" until chosen)
        self.series: dict[str, list[tuple[int, Optional[float]]]] = {}
        self.samples = 0
        self.armed_for: Optional[int] = None
        self._handles: list = []
        self._amax: dict[str, Any] = {}

    @property
    def model(self):
        return self._model()

    def follow(self, model) -> None:
        """Measure ``model`` from now on, its modules not chosen yet; the series go on."""
        self.close()
        self._model = weakref.ref(model)
        self.layers, self.paths, self.how = {}, [], ""

    # -- which modules ----------------------------------------------------------------------------------------------
    def track(self, modules: dict, how: str = "") -> None:
        self.layers = {n: weakref.ref(m) for n, m in modules.items()}
        self.how = how

    def track_conv_linear(self, how: str = "") -> None:
        """Every convolution and linear layer, each its own path."""
        modules = {n: m for n, m in self.backend.modules(self.model).items() if conv_or_linear(m)}
        self.paths = [(n, (n,)) for n in modules]
        self.track(modules, how)

    def track_scan(self, report, *, starts: bool = False) -> None:
        """The layers of the unnormalized paths of a scan ``report`` (and, with ``starts``, each normalized path's
        first layer)."""
        self.paths = [(p.start, tuple(p.layers)) for p in report.paths if not p.normalized]
        names: dict[str, None] = {}
        for p in report.paths:
            names.update(dict.fromkeys(p.layers if not p.normalized else p.layers[:1] if starts else ()))
        modules = self.backend.modules(self.model)
        self.track({n: modules[n] for n in names if n and n in modules}, "scan")

    # -- one sample -------------------------------------------------------------------------------------------------
    def arm(self, step: int) -> None:
        """Hook the tracked modules for forward number ``step`` (its sample is read by :meth:`collect`)."""
        if self.armed_for == step:
            return
        self.detach()
        self.armed_for, self._amax = step, {}
        for name, ref in self.layers.items():
            module = ref()
            if module is not None:
                self._handles.append(self.backend.forward_hook(module, self._hook(name, module)))

    def _hook(self, name: str, module):
        ts, amax, module_ref = self.backend.tensors, self._amax, weakref.ref(module)

        def hook(outputs) -> None:
            m = module_ref()
            if m is not None and not self.counts(m):
                return
            floats = ts.checkable_leaves(outputs)
            if not floats:
                return
            with self.quiet(), ts.no_grad():
                prev = amax.get(name)
                for t in floats:
                    value = ts.abs_max(t)
                    prev = value if prev is None else ts.maximum(prev, value)
                amax[name] = prev

        return hook

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def collect(self, step: int) -> Optional[dict[str, float]]:
        """Unhook; step ``step``'s abs-max per module (one host sync), kept and judged by the rules; None when no
        sample of that step was taken."""
        armed, self.armed_for = self.armed_for, None
        self.detach()
        taken, self._amax = self._amax, {}
        if armed != step or not taken:
            return None
        names = list(taken)
        amax = dict(zip(names, self.backend.tensors.to_floats([taken[n] for n in names])))
        self.samples += 1
        prefix = self.prefix()
        for name, value in amax.items():
            value = float(value) if value is not None and math.isfinite(value) else None
            keep_span(self.series.setdefault(_join(prefix, name), []), (step, value))
        for rule in self.rules:
            rule(self, step, amax)
        return amax

    def close(self) -> None:
        self.detach()
        self.armed_for = None


def _join(prefix: str, name: str) -> str:
    from .modpath import join

    return join(prefix, name) if prefix else name


class ThresholdRule:
    """``ampsafe.watch``'s rule: a path whose abs-max (its layers' largest) leaves less than ``margin_bits`` of
    float16 headroom warns, once per path (and again if it goes on to overflow). ``emit(warning)`` reports one."""

    def __init__(self, margin_bits: float, emit: Callable[[HeadroomWarning], None]) -> None:
        self.margin_bits = margin_bits
        self.emit = emit
        self.warned: set = set()

    def __call__(self, monitor: HeadroomMonitor, step: int, amax: dict) -> None:
        path_amax = {}
        for start, layers in monitor.paths:
            seen = [amax[x] for x in layers if x in amax]
            if seen:
                path_amax[start] = (layers, max(seen))
        for warning in headroom_warnings(path_amax, margin_bits=self.margin_bits, step=step, already=self.warned):
            self.emit(warning)
