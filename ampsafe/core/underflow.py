"""Gradient underflow in float16, measured on one step's gradients: :func:`measure_underflow` and :func:`judge_scale`.

Why: the loss scale exists to lift small gradients out of float16's underflow, and a floor (or a move below it)
trades overflow against underflow. Float16's smallest normal is 2**-14 (6.1e-5) and its smallest subnormal 2**-24
(6e-8): a scaled gradient element below 2**-14 keeps fewer than 10 mantissa bits, and one at or below 2**-25 rounds
to zero without a word. Nothing else in a run says how much of the gradient that is, or what a lower scale costs.

What is counted (:class:`Underflow`), and what is not:

* the gradients the step's backward left on the parameters, still multiplied by the loss scale (read before the
  scaler unscales them, or at scale 1 with no scaler), each element as float16 holds it: the value rounded to
  float16 (``zero``: it rounds to 0; ``subnormal``: non-zero and below 2**-14). A gradient computed in float16 (an
  autocast matmul's, a ``model.half()`` parameter's) is held so already; one computed in float32 (a norm's weight
  under autocast, an FP32 island) is counted as float16 would hold it.
* ``zero`` counts every zero, also the elements that are zero in float32 too (unused embedding rows, dead ReLU
  units): telling them apart would take a float32 backward, which the measurement never runs. So ``zero`` is an
  upper bound on what float16 flushed; the change of ``zero`` with the scale is what underflow did.
* :meth:`Underflow.lost_at` judges another scale from the non-zero elements' magnitudes (a histogram of
  log2 |g|): the fraction of them that would round to zero at that scale. The backward at that scale would also
  flush activation gradients inside it, which a parameter gradient does not show, so it is a lower bound.

The tensor work goes through the Backend's ``tensors.to_numpy`` (one float32 host copy per gradient) and numpy:
run on sampled steps only (``ampsafe run`` samples as its headroom sampler does; ``bench/results/underflow_cost.md``
measures the cost). Framework-neutral: imports neither torch nor paddle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Underflow",
    "measure_underflow",
    "judge_scale",
    "lift_scale",
    "model_grads",
    "FP16_TINY",
    "FP16_MIN_SUBNORMAL",
    "LOST_LIMIT",
    "WORST_MODULES",
]

FP16_TINY = 2.0**-14  # float16's smallest normal: below it a value keeps fewer than 10 mantissa bits
FP16_MIN_SUBNORMAL = 2.0**-24  # float16's smallest subnormal: at or below half of it a value rounds to zero
_FLUSH_LOG2 = -25.0  # |v| <= 2**-25 rounds to zero in float16 (round half to even)
LOST_LIMIT = 0.01  # judge_scale's default: a scale that flushes more than 1% of the non-zero gradient is named
LIFT_CAP = 2.0**15  # lift_scale's highest proposal: the scale a dynamic scaler starts from, not where it ends
LIFT_HEADROOM_BITS = 4  # lift_scale keeps the largest measured gradient this many bits below float16's 2**16
WORST_MODULES = 5  # modules kept in Underflow.per_module


@dataclass(frozen=True)
class Underflow:
    """One measurement of one step's gradients at one loss scale (see the module's docstring for what is counted).

    ``elements``: gradient elements counted (finite and not); ``zero``: the fraction that rounds to zero in
    float16; ``subnormal``: the fraction non-zero and below 2**-14 (precision lost); ``per_module``: module path ->
    (zero, subnormal) of the parameters it owns directly, for the :data:`WORST_MODULES` modules with the most
    (zero + subnormal); ``exponents``: (e, count) of the non-zero finite elements as float16 holds them, ``e`` the
    smallest integer with |v| <= 2**e (|v| in (2**(e-1), 2**e]: float16's smallest subnormal, 2**-24, is in bin
    -24), what :meth:`lost_at` reads."""

    step: int
    scale: float
    elements: int
    zero: float
    subnormal: float
    per_module: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    exponents: tuple[tuple[int, int], ...] = ()

    @property
    def nonzero(self) -> int:
        """Non-zero finite elements at this scale (the histogram's total)."""
        return sum(n for _, n in self.exponents)

    def lost_at(self, scale: float) -> float:
        """The fraction of the elements non-zero now that would round to zero in float16 at ``scale`` (0 at a
        scale at or above this one). Each value is moved by ``scale / self.scale``; within one exponent bin the
        values are taken as spread evenly in log2, exact for a power-of-two ratio (every loss scale of a dynamic
        scaler), where a value landing on 2**-25 counts as flushed (float16 rounds that tie to zero). A lower bound: see the module's docstring."""
        total = self.nonzero
        if total == 0 or not scale > 0 or scale >= self.scale:
            return 0.0
        cut = _FLUSH_LOG2 - math.log2(scale / self.scale)  # a value flushes when log2|v| <= cut
        lost = 0.0
        for e, n in self.exponents:
            if e <= cut:
                lost += n
            elif e - 1 < cut:
                lost += n * (cut - (e - 1))
        return lost / total

    def subnormal_at(self, scale: float) -> float:
        """The fraction of the elements non-zero now that would still sit below 2**-14 (or flush) in float16 at
        ``scale``, a scale at or above this one (a power-of-two ratio: the histogram's bins move whole). Counted by
        bin, so a value exactly on 2**-14 counts as below it."""
        total = self.nonzero
        if total == 0 or not scale >= self.scale:
            return 0.0
        shift = math.log2(scale / self.scale)
        return sum(n for e, n in self.exponents if e + shift <= -14) / total

    def to_dict(self) -> dict[str, Any]:
        """The record's fields as JSON holds them (the histogram left out: it judges scales in the run)."""
        return {
            "step": self.step,
            "scale": self.scale,
            "elements": self.elements,
            "zero": self.zero,
            "subnormal": self.subnormal,
            "per_module": {k: list(v) for k, v in self.per_module.items()},
        }


def model_grads(backend, model) -> list[tuple[str, Any]]:
    """(parameter path, gradient) of every parameter of ``model`` that has one, each parameter once, paths as
    ``Backend.modules`` spells its owner (``head.fc.weight``)."""
    out, seen = [], set()
    for path, module in backend.modules(model).items():
        for name, p in (getattr(module, "_parameters", None) or {}).items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            grad = getattr(p, "grad", None)
            if grad is not None:
                out.append((f"{path}.{name}" if path else name, grad))
    return out


def measure_underflow(backend, named_grads: Iterable[tuple[str, Any]], scale: float, step: int) -> Underflow:
    """Measure ``named_grads`` ((parameter path, gradient) pairs, the gradients still multiplied by ``scale``: as
    the step's backward left them) as float16 holds them. One host copy per gradient (``tensors.to_numpy``)."""
    ts = backend.tensors
    elements = zero = subnormal = 0
    exponents: dict[int, int] = {}
    modules: dict[str, list[int]] = {}
    with ts.no_grad():
        for name, grad in named_grads:
            a = ts.to_numpy(grad)
            if a is None or a.size == 0:
                continue
            a = np.ravel(a)
            with np.errstate(over="ignore", invalid="ignore"):
                h = np.abs(a.astype(np.float16))  # as float16 holds it (inf past 65504)
            z = int(np.count_nonzero(h == 0))
            s = int(np.count_nonzero((h > 0) & (h < FP16_TINY)))
            elements += a.size
            zero += z
            subnormal += s
            counts = modules.setdefault(name.rpartition(".")[0], [0, 0, 0])
            counts[0] += a.size
            counts[1] += z
            counts[2] += s
            kept = h[(h > 0) & np.isfinite(h)].astype(np.float64)
            if kept.size:
                mantissa, e = np.frexp(kept)
                e = e - (mantissa == 0.5)  # a power of two 2**k goes to bin k: |v| in (2**(e-1), 2**e]
                low = int(e.min())
                for i, n in enumerate(np.bincount(e - low)):
                    if n:
                        exponents[low + i] = exponents.get(low + i, 0) + int(n)
    if not elements:
        return Underflow(step=step, scale=float(scale), elements=0, zero=0.0, subnormal=0.0)
    frac = {m: (z / n, s / n) for m, (n, z, s) in modules.items() if n}
    worst = sorted(frac.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:WORST_MODULES]
    return Underflow(
        step=step,
        scale=float(scale),
        elements=elements,
        zero=zero / elements,
        subnormal=subnormal / elements,
        per_module=dict(worst),
        exponents=tuple(sorted(exponents.items())),
    )


def judge_scale(underflow: Underflow, scale: float, limit: float = LOST_LIMIT) -> str | None:
    """A sentence when ``scale`` would flush more than ``limit`` (default 1%) of the gradient elements that are
    non-zero in float16 at the measured scale (:meth:`Underflow.lost_at`), else None: what a move of the scale
    below the floor is judged by."""
    lost = underflow.lost_at(scale)
    if lost <= limit:
        return None
    return (
        f"a loss scale of {scale:g} would flush {lost:.1%} of the gradient elements that are non-zero in float16 "
        f"at scale {underflow.scale:g} (step {underflow.step}) to zero, more than the {limit:.0%} allowed "
        "(measured on the parameter gradients: the activation gradients inside the backward lose at least as much)"
    )


def lift_scale(
    underflow: Underflow, limit: float = LOST_LIMIT, cap: float = LIFT_CAP, headroom_bits: int = LIFT_HEADROOM_BITS
) -> float:
    """The loss scale to start a dynamic scaler from, chosen from one measurement: the smallest power-of-two
    multiple of the measured scale at which at most ``limit`` (1%) of the non-zero gradient elements still sit below
    float16's smallest normal (:meth:`Underflow.subnormal_at`), kept so that the largest measured element stays
    ``headroom_bits`` below 2**16 and at most ``cap``; never below the measured scale.

    Why a start and not an answer: the measurement sees the parameter gradients only, and the elements already
    flushed at the measured scale are not in its histogram; a dynamic scaler moves on from this value."""
    scale = float(underflow.scale)
    if not underflow.exponents or not scale > 0:
        return max(scale, 1.0)
    top = max(e for e, _ in underflow.exponents)
    highest = min(float(cap), scale * 2.0 ** (16 - headroom_bits - top))
    chosen = scale
    while chosen * 2 <= highest and underflow.subnormal_at(chosen) > limit:
        chosen *= 2
    return chosen
