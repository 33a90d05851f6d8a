"""The ``amp/*`` metrics: one namespace and one set of names for torch and Paddle, read from a scaler's own state.

Why one function: every integration (HF, Lightning, mmengine, a plain loop) logs the same names with the same
meaning, so a dashboard built for one trainer reads another's run. Only what the scaler itself holds is logged:

=====================  ============================================================================================
``amp/loss_scale``     the scale the next step runs with (every scaler; 1.0 when scaling is off, as the frameworks)
``amp/overflow_steps``  steps whose gradients were non-finite (ampsafe's scalers: ``scaler.stats``)
``amp/skipped_steps``  optimizer steps skipped (non-finite gradients or loss)
``amp/heals``          heals: FP32 islands made while training (``on_floor="heal"`` / ``patience``)
``amp/floor_hits``     overflowing steps taken with the scale already at ``min_scale``
=====================  ============================================================================================

A framework's own scaler (``torch.amp.GradScaler``, ``paddle.amp.GradScaler``) counts none of these, so for it
only ``amp/loss_scale`` is logged: no figure is made up. The gradient norm and the per-path float16 headroom
are no counter of the scaler: they come from its ``metric_sources`` (``ampsafe run`` adds its sampler,
:mod:`ampsafe.run.headroom`, which measures in the step's own forward), once a sample was taken:

=================================  ===============================================================================
``amp/grad_norm_unscaled``         the gradients' 2-norm after unscaling, at the latest sampled step
``amp/min_headroom_bits``          log2(65504 / amax) of the tracked module with the least float16 headroom
``amp/headroom_bits/<module>``     the same for each of the few modules with the least headroom
``amp/grad_zero_frac``             the fraction of gradient elements float16 holds as zero at the step's scale
``amp/grad_subnormal_frac``        the fraction non-zero and below 2**-14 (precision lost), same sample
=================================  ===============================================================================

The two gradient fractions are read before the scaler unscales (:mod:`ampsafe.core.underflow` says what they
count: ``zero`` includes elements that are zero in float32 too).
"""

from __future__ import annotations

from typing import Any, Optional

from ..core.scale import ScalerStats

__all__ = ["PREFIX", "COUNTS", "LOSS_SCALE", "NAMES", "SAMPLED", "amp_metrics", "loss_scale"]

PREFIX = "amp/"
LOSS_SCALE = PREFIX + "loss_scale"
# name -> how it is read from ScalerStats
COUNTS = {
    PREFIX + "overflow_steps": lambda stats: stats.overflow_steps,
    PREFIX + "skipped_steps": lambda stats: stats.skipped_steps,
    PREFIX + "heals": lambda stats: len(stats.heals),
    PREFIX + "floor_hits": lambda stats: stats.floor_hits,
}
NAMES = (LOSS_SCALE, *COUNTS)
# from the run's headroom samples; ``amp/headroom_bits/<module>`` per module beside them
SAMPLED = (
    PREFIX + "grad_norm_unscaled",
    PREFIX + "min_headroom_bits",
    PREFIX + "grad_zero_frac",
    PREFIX + "grad_subnormal_frac",
)


def loss_scale(scaler: Any) -> Optional[float]:
    """The scaler's current loss scale as a float, through its own getter: torch's and ampsafe's ``get_scale()``,
    ampsafe Paddle's ``get_loss_scaling()``, Paddle's ``_scale`` tensor (``paddle.amp.GradScaler`` has no public
    getter for the current scale; 1.0 when it is disabled, as ampsafe's). None for an object that is no scaler."""
    for getter in ("get_scale", "get_loss_scaling"):
        if callable(getattr(scaler, getter, None)):
            return float(getattr(scaler, getter)())
    if callable(getattr(scaler, "is_enable", None)) and hasattr(scaler, "_scale"):
        if not scaler.is_enable():
            return 1.0
        value = scaler._scale
        return float(value.item() if hasattr(value, "item") else value)
    return None


def amp_metrics(scaler: Any) -> dict[str, float]:
    """``{"amp/loss_scale": ..., "amp/overflow_steps": ..., ...}`` for ``scaler``: all five names for ampsafe's
    scalers (torch and Paddle), ``amp/loss_scale`` alone for a framework's own scaler, ``{}`` for None (a run
    without loss scaling); and what each of the scaler's ``metric_sources`` reports (``source.metrics()``: the
    sampled names, for a scaler ``ampsafe run`` samples). Cheap enough for every logging step: host-side
    counters, one scale read and the latest sample."""
    if scaler is None:
        return {}
    out: dict[str, float] = {}
    scale = loss_scale(scaler)
    if scale is not None:
        out[LOSS_SCALE] = scale
    stats = getattr(scaler, "stats", None)
    if isinstance(stats, ScalerStats):
        out.update({name: float(read(stats)) for name, read in COUNTS.items()})
    for source in getattr(scaler, "metric_sources", ()):
        out.update(source.metrics())
    return out
