"""Float16 headroom over time under ``ampsafe run``, and a warning before the overflow: :class:`HeadroomSampler`.

Why: a path's float16 headroom shrinks over steps (Adam's first steps grow DBNet's unnormalized neck, T5's
``DenseReluDense.wo``) long before the loss scale collapses, and nothing else shows it. The sampler takes it from
the step's OWN forward: forward hooks on the tracked modules, attached for the sampled steps only, keep a float32
abs-max of each output on the device and read them all with one host sync at the scaler's update, with the
unscaled gradient norm. No extra forward and no collective is ever run for a sample.

* Tracked modules: the conv and linear layers at step 0 (the model the FP32 guard found when the optimizer was
  built), then the layers of the paths ``ampsafe.scan`` finds (each path's start, and every layer of an
  unnormalized path), from one scan of step 1's captured batch (the scaler hooks its model at its first step,
  after step 0's forward), model state restored. Where that scan would be a forward other ranks must join or
  that an engine owns (FSDP2's all-gathers, a DeepSpeed engine, any process group of more than one rank), the conv
  and linear layers stay, and no gradient norm is taken where an engine holds or shards the gradients.
* Sampled steps: every ``every``-th, every step of the first ``every`` (Adam's first steps move fastest), and every
  step while a projected crossing is within twice the horizon (or the interval).
* The warning: :mod:`.headroom_trend` (the rule, on the samples kept here).
* Gradient underflow (:mod:`ampsafe.core.underflow`), on the same sampled steps: the model's gradients read at the
  scaler's first ``unscale_`` of the step (:meth:`HeadroomSampler.before_unscale`, which the run's scaler class
  calls), while they still carry the loss scale and before clipping or the optimizer touches them.

The model is held weakly, and the hooks go with it. :func:`sampler_of` hands ``amp_metrics`` a scaler's sampler.
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Any, Optional

from ..core.capture import example_inputs
from .headroom_trend import bits, judge
from .records import Headroom, HeadroomAlert
from .underflow import UnderflowSeries

__all__ = ["HeadroomSampler", "sampler_of", "DEFAULT_EVERY", "TOP"]

DEFAULT_EVERY = 10  # the options' default: bench/results/headroom.md measures its cost
TOP = 5  # modules with the least headroom in the metrics
KEPT_MODULES = 8  # series kept in the summary (the least headroom seen, and the warned one)
KEPT_SAMPLES = 5000  # samples kept per module

_samplers: weakref.WeakKeyDictionary[Any, HeadroomSampler] = weakref.WeakKeyDictionary()


def sampler_of(scaler) -> Optional[HeadroomSampler]:
    """The headroom sampler ``ampsafe run`` keeps for ``scaler``, or None."""
    try:
        return _samplers.get(scaler)
    except TypeError:  # a scaler that takes no weak reference is never sampled
        return None


class HeadroomSampler:
    """The headroom of one run scaler's model. ``every``: sample every N-th optimizer step; ``prefix()``: the
    model's path in the object the user holds (names in the warning and the report); ``say``: where the one
    warning line goes (stderr, whatever ``--quiet`` says: it is not a patch line)."""

    def __init__(self, scaler, every: int, prefix=lambda: "", say=None, model=None, underflow: bool = True) -> None:
        self.every = every
        self.prefix = prefix
        self.say = say or (lambda line: print(f"[ampsafe] {line}", file=sys.stderr, flush=True))
        self._model: Optional[Any] = None  # a weakref to the scaler's model, once resolved
        self.backend = None
        self.layers: dict[str, Any] = {}  # name -> weakref to the module
        self.how = ""  # how the tracked modules were chosen ("" until chosen)
        self.note: Optional[str] = None
        self.series: dict[str, list[tuple[int, Optional[float]]]] = {}
        self.grad_norm: list[tuple[int, Optional[float]]] = []
        self.alert: Optional[HeadroomAlert] = None
        self.samples = 0
        self.near = False  # a projected crossing within the horizon: sample every step
        self.sharded = False  # gradients an engine holds or shards: no norm (it would take a collective)
        self._handles: list = []
        self._amax: dict[str, Any] = {}
        self._armed_for: Optional[int] = None
        self.underflow: Optional[UnderflowSeries] = UnderflowSeries(every) if underflow else None
        self._underflow_for: Optional[int] = 0  # the step whose gradients the next unscale_ measures
        try:
            _samplers[scaler] = self
        except TypeError:
            pass
        if model is not None and hasattr(scaler, "_backend"):  # known before step 0 (the FP32 guard found it)
            self.begin(scaler, model)
            self._arm(0)

    # -- per step ----------------------------------------------------------------------------------------------------
    def sampled(self, step: int) -> bool:
        return step < self.every or step % self.every == 0 or self.near

    def on_step(self, scaler, decision) -> None:
        """The scaler's update of step ``decision.step``: read that step's sample, choose the tracked modules by
        the scan once a captured batch is there, arm the next sampled step."""
        step = decision.step
        try:
            self._on_step(scaler, decision, step)
        finally:
            self._underflow_for = step + 1 if self.sampled(step + 1) else None

    def _on_step(self, scaler, decision, step: int) -> None:
        model = getattr(scaler, "model", None)
        if model is not None and model is not self.model and hasattr(scaler, "_backend"):
            self._detach()
            self._armed_for = None
            self.begin(scaler, model)  # the scaler resolved another model than the guess
        elif self._armed_for is not None:
            self._read(scaler, step, decision)
        if self.model is None:
            return
        if not self.how:
            self._choose(scaler)
        if self.layers and self.sampled(step + 1):
            self._arm(step + 1)

    def before_unscale(self, scaler) -> None:
        """The scaler is about to unscale an optimizer's gradients: on a sampled step, at its first unscale, measure
        the model's gradients as the backward left them (still times the scale: as float16 held them). Not where
        an engine holds or shards the gradients (a rank's own are not the model's)."""
        step, self._underflow_for = self._underflow_for, None
        if step is None or self.underflow is None or self.sharded or not hasattr(scaler, "_backend"):
            return
        model = getattr(scaler, "model", None) or self.model
        scale = 1.0 if getattr(scaler, "_guard", False) else _scale_of(scaler)
        if model is None or scale is None:
            return
        self.underflow.measure(scaler._backend(), model, float(scale), step)

    @property
    def model(self):
        return self._model() if self._model is not None else None

    def begin(self, scaler, model) -> None:
        """Track ``model``'s conv/linear layers from its next forward on (until the scan chooses)."""
        self.backend = scaler._backend()
        self._model = weakref.ref(model)
        self.sharded = getattr(scaler, "engine", None) is not None or self.backend.sharding.forward_is_collective(model)
        self.how = ""
        self._use({n: m for n, m in self.backend.modules(model).items() if _conv_or_linear(m)})

    def _use(self, modules: dict) -> None:
        self.layers = {n: weakref.ref(m) for n, m in modules.items()}

    def _choose(self, scaler) -> None:
        """The modules of the paths ``ampsafe.scan`` finds on the captured batch (from step 1 on: the scaler hooks
        its model at its first step, after that forward), or the conv/linear layers where a scan is no forward
        of this process's alone."""
        model = self.model
        why = _no_scan(scaler, model, self.backend)
        capture = getattr(scaler, "capture", None)
        latest = capture.latest if capture is not None else None
        if why is None and latest is None:
            return  # step 0: try again at the next update
        if why is None:
            try:
                names = self._scanned(model, capture, latest)
                modules = self.backend.modules(model)
                self._use({n: modules[n] for n in names if n in modules})
                self.how = "scan"
                return
            except Exception as exc:  # noqa: BLE001 - the scan only chooses what to sample
                why = f"the scan failed: {type(exc).__name__}: {str(exc)[:120]}"
        self.how = f"conv/linear layers ({why})"
        if not self.layers:
            self.note = "no conv/linear layer to sample"

    def _scanned(self, model, capture, latest) -> list[str]:
        """Each path's start and every layer of an unnormalized path, from one scan (model state restored)."""
        import ampsafe

        with self.backend.replay(model), capture.paused():
            report = ampsafe.scan(model, example_inputs(model, latest))
        names: dict[str, None] = {}
        for p in report.paths:
            names.update(dict.fromkeys(n for n in (p.layers if not p.normalized else p.layers[:1]) if n))
        return list(names)

    def _arm(self, step: int) -> None:
        if self._armed_for == step:
            return
        self._detach()
        self._armed_for, self._amax = step, {}
        for name, ref in self.layers.items():
            module = ref()
            if module is not None:
                self._handles.append(self.backend.forward_hook(module, self._hook(name, module)))

    def _hook(self, name: str, module):
        ts = self.backend.tensors
        amax = self._amax
        module_ref = weakref.ref(module)

        def hook(outputs) -> None:
            m = module_ref()
            if m is not None and not getattr(m, "training", True):
                return  # an evaluation forward between steps is not the step's
            floats = ts.float_leaves(outputs)
            if not floats:
                return
            with ts.no_grad():
                prev = amax.get(name)
                for t in floats:
                    value = ts.abs_max(t)
                    prev = value if prev is None else ts.maximum(prev, value)
                amax[name] = prev

        return hook

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _read(self, scaler, step: int, decision) -> None:
        armed, self._armed_for = self._armed_for, None
        self._detach()
        if armed != step or not self._amax:
            self._amax = {}
            return
        names = list(self._amax)
        values = self.backend.tensors.to_floats([self._amax[n] for n in names])  # one host sync
        self._amax = {}
        self._keep(step, dict(zip(names, values)), self._grad_norm(scaler, decision))

    def _grad_norm(self, scaler, decision) -> Optional[float]:
        """The unscaled gradient norm of the model's parameters (the scaler's step unscaled them); None on an
        overflowing step, or where gradients are sharded (the global norm would take a collective)."""
        model = self.model
        if model is None or decision.found_inf or self.sharded:
            return None
        try:
            return self.backend.tensors.grad_norm(self.backend.parameters(model))
        except Exception:  # noqa: BLE001 - a figure, never a failure
            return None

    def _keep(self, step: int, amax: dict[str, Optional[float]], grad_norm: Optional[float]) -> None:
        self.samples += 1
        prefix = self.prefix()
        for name, value in amax.items():
            value = float(value) if value is not None and math.isfinite(value) else None
            _append(self.series.setdefault(_join(prefix, name), []), (step, value))
        _append(self.grad_norm, (step, grad_norm))
        self._judge(step)

    def _judge(self, step: int) -> None:
        """Project each module's crossing (:func:`~.headroom_trend.judge`); warn once."""
        self.near, alert = judge(self.series, step, self.every)
        if alert is not None and self.alert is None:
            self.alert = alert
            self.say(alert.message)

    # -- readers -----------------------------------------------------------------------------------------------------
    def latest(self) -> dict[str, float]:
        """module -> headroom bits at its latest sample (non-finite samples: -inf)."""
        out = {}
        for name, points in self.series.items():
            if points:
                b = bits(points[-1][1])
                out[name] = -math.inf if b is None else b
        return out

    def metrics(self) -> dict[str, float]:
        """``amp/grad_norm_unscaled``, ``amp/min_headroom_bits`` and ``amp/headroom_bits/<module>`` for the
        :data:`TOP` modules with the least headroom, and ``amp/grad_zero_frac`` / ``amp/grad_subnormal_frac``, at
        the latest sample ({} before one)."""
        latest = {k: v for k, v in self.latest().items() if not math.isinf(v) or v < 0}
        out: dict[str, float] = {}
        if self.grad_norm and self.grad_norm[-1][1] is not None:
            out["amp/grad_norm_unscaled"] = float(self.grad_norm[-1][1])
        if latest:
            low = sorted(latest.items(), key=lambda kv: kv[1])[:TOP]
            out["amp/min_headroom_bits"] = float(low[0][1])
            out.update({f"amp/headroom_bits/{name}": float(value) for name, value in low})
        if self.underflow is not None:
            out.update(self.underflow.metrics())
        return out

    def record(self) -> Headroom:
        """The summary's record: the :data:`KEPT_MODULES` series with the least headroom seen (the warned one
        first among them), the gradient norms and the warning."""

        def least(points):
            values = [bits(a) for _, a in points]
            return min((-math.inf if b is None else b for b in values), default=math.inf)

        names = sorted(self.series, key=lambda n: least(self.series[n]))
        if self.alert is not None and self.alert.module in self.series:
            names = [self.alert.module] + [n for n in names if n != self.alert.module]
        kept = {n: tuple(self.series[n]) for n in names[:KEPT_MODULES]}
        return Headroom(
            every=self.every,
            paths=self.how,
            tracked=len(self.layers or {}),
            samples=self.samples,
            series=kept,
            grad_norm=tuple(self.grad_norm),
            alert=self.alert,
            note=self.note,
        )

    def close(self) -> None:
        self._detach()
        self._armed_for = None


def _append(points: list, point: tuple) -> None:
    """Append; a full list (:data:`KEPT_SAMPLES`) first keeps every other point of its older half, so a long run
    keeps its whole span, densest where it is recent."""
    if len(points) >= KEPT_SAMPLES:
        half = KEPT_SAMPLES // 2
        points[:] = points[:half:2] + points[half:]
    points.append(point)


def _join(prefix: str, name: str) -> str:
    from ..core.modpath import join

    return join(prefix, name) if prefix else name


def _scale_of(scaler) -> Optional[float]:
    """The scaler's current scale: the run's class's reading, else ampsafe's getters (torch's, Paddle's)."""
    for getter in ("_run_scale", "get_scale", "get_loss_scaling"):
        read = getattr(scaler, getter, None)
        if callable(read):
            return read()
    return None


def _conv_or_linear(module) -> bool:
    name = type(module).__name__
    return ("Conv" in name or "Linear" in name) and "Transpose" not in name or name == "Conv1D"


def _no_scan(scaler, model, backend) -> Optional[str]:
    """Why a scan of the captured batch would be a forward the sampler must not run, or None."""
    if getattr(scaler, "engine", None) is not None:
        return "a DeepSpeed engine runs the forward"
    if backend.sharding.forward_is_collective(model):
        return "every forward is collective (FSDP2)"
    try:
        world = backend.world_size()
    except Exception:  # noqa: BLE001 - unknown: alone
        world = 1
    if world > 1:
        return f"one of {world} ranks: a forward of its own could meet the others' collectives"
    return None
