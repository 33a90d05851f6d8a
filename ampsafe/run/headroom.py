"""Float16 headroom over time under ``ampsafe run``, and a warning before the overflow: :class:`HeadroomSampler`.

Why: a path's float16 headroom shrinks over steps (Adam's first steps grow DBNet's unnormalized neck, T5's
``DenseReluDense.wo``) long before the loss scale collapses, and nothing else shows it. The measurement is the
core's :class:`~ampsafe.core.headroom.HeadroomMonitor` (hooks in the step's OWN forward on the sampled steps only,
a device abs-max, one host sync at the scaler's update); this module decides which steps, which modules, and
adds the unscaled gradient norm. No extra forward and no collective is ever run for a sample.

* Tracked modules: the conv and linear layers at step 0 (the model the FP32 guard found when the optimizer was
  built), then the layers of the paths ``ampsafe.scan`` finds (each path's start, and every layer of an
  unnormalized path), from one scan of step 1's captured batch (the scaler hooks its model at its first step,
  after step 0's forward), model state restored. Where that scan would be a forward other ranks must join or
  that an engine owns (FSDP2's all-gathers, a DeepSpeed engine, any process group of more than one rank), the conv
  and linear layers stay, and no gradient norm is taken where an engine holds or shards the gradients.
* Sampled steps: every ``every``-th, every step of the first ``every`` (Adam's first steps move fastest), and every
  step while a projected crossing is within twice the horizon (or the interval).
* The warning: :class:`~.headroom_trend.TrendRule`, the monitor's rule.
* Gradient underflow (:mod:`ampsafe.core.underflow`), on the same sampled steps: the model's gradients read at the
  scaler's first ``unscale_`` of the step (:meth:`HeadroomSampler.before_unscale`, which the run's scaler class
  calls), while they still carry the loss scale and before clipping or the optimizer touches them.

The sampler is one of the scaler's ``metric_sources``: ``amp_metrics(scaler)`` reads it there.
"""

from __future__ import annotations

import math
import sys
from typing import Optional

from ..core.capture import example_inputs
from ..core.headroom import HeadroomMonitor, keep_span
from .headroom_trend import TrendRule, bits
from .records import Headroom
from .underflow import UnderflowSeries

__all__ = ["HeadroomSampler", "sampler_of", "DEFAULT_EVERY", "TOP"]

DEFAULT_EVERY = 10  # the options' default: bench/results/headroom.md measures its cost
TOP = 5  # modules with the least headroom in the metrics
KEPT_MODULES = 8  # series kept in the summary (the least headroom seen, and the warned one)


def sampler_of(scaler) -> Optional[HeadroomSampler]:
    """The headroom sampler among ``scaler``'s metric sources, or None."""
    return next((s for s in getattr(scaler, "metric_sources", ()) if isinstance(s, HeadroomSampler)), None)


class HeadroomSampler:
    """The headroom of one run scaler's model. ``every``: sample every N-th optimizer step; ``prefix()``: the
    model's path in the object the user holds (names in the warning and the report); ``say``: where the one
    warning line goes (stderr, whatever ``--quiet`` says: it is not a patch line)."""

    def __init__(self, scaler, every: int, prefix=lambda: "", say=None, model=None, underflow: bool = True) -> None:
        self.every = every
        self.prefix = prefix
        self.trend = TrendRule(every, say or (lambda line: print(f"[ampsafe] {line}", file=sys.stderr, flush=True)))
        self.monitor: Optional[HeadroomMonitor] = None  # once the scaler's model is known
        self.backend = None
        self.note: Optional[str] = None
        self.grad_norm: list[tuple[int, Optional[float]]] = []
        self.sharded = False  # gradients an engine holds or shards: no norm (it would take a collective)
        self.underflow: Optional[UnderflowSeries] = UnderflowSeries(every) if underflow else None
        self._underflow_for: Optional[int] = 0  # the step whose gradients the next unscale_ measures
        sources = getattr(scaler, "metric_sources", None)
        if sources is not None:
            sources.append(self)
        if model is not None and hasattr(scaler, "_backend"):  # known before step 0 (the FP32 guard found it)
            self.begin(scaler, model)
            self.monitor.arm(0)

    # -- per step ----------------------------------------------------------------------------------------------------
    def sampled(self, step: int) -> bool:
        return step < self.every or step % self.every == 0 or self.trend.near

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
            self.begin(scaler, model)  # the scaler resolved another model than the guess
        elif self.monitor is not None and self.monitor.armed_for is not None:
            if self.monitor.collect(step) is not None:
                keep_span(self.grad_norm, (step, self._grad_norm(decision)))
        if self.model is None:
            return
        if not self.monitor.how:
            self._choose(scaler)
        if self.monitor.layers and self.sampled(step + 1):
            self.monitor.arm(step + 1)

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
        return self.monitor.model if self.monitor is not None else None

    def begin(self, scaler, model) -> None:
        """Track ``model``'s conv/linear layers from its next forward on (until the scan chooses)."""
        self.backend = scaler._backend()
        if self.monitor is None:
            self.monitor = HeadroomMonitor(self.backend, model, rules=(self.trend,), prefix=self.prefix)
        else:
            self.monitor.follow(model)
        self.sharded = getattr(scaler, "engine", None) is not None or self.backend.sharding.forward_is_collective(model)
        self.monitor.track_conv_linear()

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
                self.monitor.track_scan(self._scanned(model, capture, latest), starts=True)
                return
            except Exception as exc:  # noqa: BLE001 - the scan only chooses what to sample
                why = f"the scan failed: {type(exc).__name__}: {str(exc)[:120]}"
        self.monitor.how = f"conv/linear layers ({why})"
        if not self.monitor.layers:
            self.note = "no conv/linear layer to sample"

    def _scanned(self, model, capture, latest):
        """One scan of the captured batch (model state restored)."""
        import ampsafe

        with self.backend.replay(model), capture.paused():
            return ampsafe.scan(model, example_inputs(model, latest))

    def _grad_norm(self, decision) -> Optional[float]:
        """The unscaled gradient norm of the model's parameters (the scaler's step unscaled them); None on an
        overflowing step, or where gradients are sharded (the global norm would take a collective)."""
        model = self.model
        if model is None or decision.found_inf or self.sharded:
            return None
        try:
            return self.backend.tensors.grad_norm(self.backend.parameters(model))
        except Exception:  # noqa: BLE001 - a figure, never a failure
            return None

    def stop(self, note: str) -> None:
        """Sample no more (a failure: training goes on without the samples)."""
        self.close()
        self.note = note
        if self.monitor is not None:
            self.monitor.layers = {}

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()

    # -- readers -----------------------------------------------------------------------------------------------------
    @property
    def series(self) -> dict[str, list[tuple[int, Optional[float]]]]:
        return self.monitor.series if self.monitor is not None else {}

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

        series, alert, monitor = self.series, self.trend.alert, self.monitor
        names = sorted(series, key=lambda n: least(series[n]))
        if alert is not None and alert.module in series:
            names = [alert.module] + [n for n in names if n != alert.module]
        return Headroom(
            every=self.every,
            paths=monitor.how if monitor is not None else "",
            tracked=len(monitor.layers) if monitor is not None else 0,
            samples=monitor.samples if monitor is not None else 0,
            series={n: tuple(series[n]) for n in names[:KEPT_MODULES]},
            grad_norm=tuple(self.grad_norm),
            alert=alert,
            note=self.note,
        )


def _scale_of(scaler) -> Optional[float]:
    """The scaler's current scale: the run's class's reading, else ampsafe's getters (torch's, Paddle's)."""
    for getter in ("_run_scale", "get_scale", "get_loss_scaling"):
        read = getattr(scaler, getter, None)
        if callable(read):
            return read()
    return None


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
