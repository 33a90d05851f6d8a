"""``ampsafe run``'s gradient-underflow samples: one series per scaler (read before its unscale) or per FP32 guard
(read at scale 1, before the optimizer step), kept as :class:`~ampsafe.run.records.UnderflowRecord`.

Why apart from :mod:`ampsafe.core.underflow`: the core measures one step; the run decides which steps (the headroom
sampler's), keeps the series a long run can hold, and words the metrics and the record. Both the scaler's sampler
(:mod:`ampsafe.run.headroom`) and the guard (:mod:`ampsafe.run.guard`) keep one :class:`UnderflowSeries`.
"""

from __future__ import annotations

from typing import Optional

from ..core.headroom import keep_span
from ..core.underflow import Underflow, measure_underflow, model_grads
from .records import UnderflowRecord

__all__ = ["UnderflowSeries", "ZERO", "SUBNORMAL", "LOST_SHIFTS", "KEPT_SAMPLES"]

ZERO = "amp/grad_zero_frac"
SUBNORMAL = "amp/grad_subnormal_frac"
LOST_SHIFTS = (1, 2, 4, 8, 16)  # the record judges the latest scale halved this many times
KEPT_SAMPLES = 5000


class UnderflowSeries:
    """The underflow samples of one scaler or guard. ``every``: the sampling interval it follows (for the record)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.samples: list[tuple[int, float, float, float]] = []  # (step, scale, zero, subnormal)
        self.latest: Optional[Underflow] = None  # the last measurement, histogram included (judge_scale reads it)
        self.note: Optional[str] = None

    def measure(self, backend, model, scale: float, step: int) -> Optional[Underflow]:
        """Measure ``model``'s gradients (still multiplied by ``scale``) as step ``step``'s sample. A failure is
        noted and ends the sampling (the measurement is advice; training goes on)."""
        if self.note is not None or model is None:
            return None
        try:
            u = measure_underflow(backend, model_grads(backend, model), scale, step)
        except Exception as exc:  # noqa: BLE001 - a sample is advice
            self.note = f"underflow sampling stopped at step {step}: {type(exc).__name__}: {exc}"[:300]
            return None
        if not u.elements:
            return None
        self.latest = u
        keep_span(self.samples, (step, u.scale, u.zero, u.subnormal), KEPT_SAMPLES)
        return u

    def metrics(self) -> dict[str, float]:
        """``amp/grad_zero_frac`` and ``amp/grad_subnormal_frac`` at the latest sample ({} before one)."""
        if self.latest is None:
            return {}
        return {ZERO: float(self.latest.zero), SUBNORMAL: float(self.latest.subnormal)}

    def record(self) -> UnderflowRecord:
        u = self.latest
        lost = ()
        if u is not None and u.scale > 0:
            lost = tuple((u.scale / 2.0**k, u.lost_at(u.scale / 2.0**k)) for k in LOST_SHIFTS)
        return UnderflowRecord(
            every=self.every,
            samples=len(self.samples),
            series=tuple(self.samples),
            elements=u.elements if u is not None else 0,
            modules=dict(u.per_module) if u is not None else {},
            lost_below=lost,
            note=self.note,
        )
