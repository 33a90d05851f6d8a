"""Loss-scale steps decided on the device: :mod:`ampsafe.core.scale`'s state machine in a few tensor ops.

Why: optimizers that unscale and skip on the device (fused Adam, ``_step_supports_amp_scaling``) never hand
``found_inf`` to the host, and torch's scaler needs no host sync for them (``_amp_update_scale_``). To cost no
more, :class:`DeviceSteps` advances the scale, the growth tracker and the overflow (hysteresis) counter on the
device, with the core's rules and rounding, and counts what the host statistics need. The host catches up in
one sync (:meth:`DeviceSteps.reconcile`) whenever it must know: ``get_scale``, ``state_dict``, a host-decided
step, or a stretch long enough to have reached the floor (:meth:`DeviceSteps.allowed`).

Example (what ``ampsafe.torch.GradScaler.update`` does for a fused optimizer)::

    steps = DeviceSteps()
    if steps.allowed(core):                      # core: the scaler's LossScaleState
        steps.step(core, scale, found_inf)       # scale: the float32 scale tensor, updated in place
    ...
    steps.reconcile(core, scale)                 # core now holds what the device decided (one sync)

The transitions equal :meth:`LossScaleState.update` step for step (the property test
``tests/scaler/test_device_scale.py`` checks it on random policies and overflow patterns); only
``scale_history`` differs: a device-decided stretch adds one entry (its final scale), not one per step.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core.scale import LossScaleState

__all__ = ["DeviceSteps"]


class DeviceSteps:
    """Steps of one scaler decided on the device and not yet known to the host (:attr:`lag` of them).

    The device state lives only while :attr:`lag` > 0: the first :meth:`step` of a stretch seeds it from the
    host state, :meth:`reconcile` folds it back and ends the stretch.
    """

    def __init__(self) -> None:
        self.lag = 0
        self._growth: Optional[torch.Tensor] = None  # int32: clean steps since the last growth or overflow
        self._overflow: Optional[torch.Tensor] = None  # int32: overflowing steps in a row (hysteresis)
        self._counts: Optional[torch.Tensor] = None  # int64 [skipped, floor hits] over the stretch
        self._last_clean: Optional[torch.Tensor] = None  # float32: the scale of the last clean step

    # -- when --------------------------------------------------------------------------------------------------------
    def allowed(self, core: LossScaleState) -> bool:
        """True when the next step may be decided on the device without hiding what needs the host:

        * per-step callbacks need a per-step host record, and a fixed scale (FP32 guard, Paddle's
          ``use_dynamic_loss_scaling=False``) has nothing to decide;
        * a stretch starts only from a scale within ``[min_scale, max_scale]`` (one set by hand with
          ``update(new_scale)`` may lie outside; the transitions keep an in-range scale in range);
        * with ``on_floor`` raise/heal and a floor, even if every unknown step (and this one) overflowed, the scale
          could not have reached ``min_scale``: a floor hit must be handled on the host, where the offenders are.
        """
        p = core.policy
        if core.callbacks or not p.dynamic:
            return False
        if self.lag == 0 and not np.float32(p.min_scale) <= core.scale <= np.float32(p.max_scale):
            return False
        if p.min_scale == 0 or not p.on_floor.acts_at_floor:
            return True
        backoffs = (core.overflow_tracker + self.lag + 1) // p.hysteresis
        return float(core.scale) * p.backoff_factor**backoffs > p.min_scale * 1.001

    # -- one step ----------------------------------------------------------------------------------------------------
    def step(self, core: LossScaleState, scale: torch.Tensor, found: torch.Tensor) -> None:
        """Advance one step on the device: ``scale`` (float32, 0-dim) is updated in place; ``found`` > 0 means
        the step overflowed (the optimizer skipped it). No host sync."""
        p = core.policy
        if self.lag == 0:
            self._seed(core, scale.device)
        found = found.to(scale.device)
        inf = found > 0
        floor_hit = inf & (scale <= p.min_scale) if p.min_scale > 0 else torch.zeros_like(inf)
        self._counts += torch.stack([inf, floor_hit])
        self._last_clean = torch.where(inf, self._last_clean, scale)
        self.lag += 1
        if p.hysteresis == 1:
            # torch's fused kernel: overflow -> scale * backoff, clean -> grow every growth_interval steps (float64
            # products, no growth to inf). Then the floor and cap, which keep an in-range scale in range exactly as
            # the core's max(scale * backoff, min) and min(scale * growth, max). The kernel grows only when the
            # tracker hits the interval exactly; the core grows at >= (a lowered interval), hence the clamp.
            self._growth.clamp_max_(p.growth_interval - 1)
            torch._amp_update_scale_(scale, self._growth, found, p.growth_factor, p.backoff_factor, p.growth_interval)
            scale.clamp_(p.min_scale, p.max_scale)
            return
        overflow = torch.where(inf, self._overflow + 1, 0)
        back = inf & (overflow >= p.hysteresis)
        self._overflow = torch.where(back, 0, overflow)
        growth = torch.where(inf, 0, self._growth + 1)
        grow = ~inf & (growth >= p.growth_interval)
        self._growth = torch.where(grow, 0, growth)
        backed = (scale.double() * p.backoff_factor).float().clamp_min(p.min_scale)
        grown = (scale.double() * p.growth_factor).float()
        grown = torch.where(torch.isfinite(grown), grown.clamp_max(p.max_scale), scale)
        scale.copy_(torch.where(back, backed, torch.where(grow, grown, scale)))

    def _seed(self, core: LossScaleState, device: torch.device) -> None:
        # with hysteresis 1 every step leaves the overflow counter at 0, and the fused kernel never touches it
        overflow = core.overflow_tracker if core.policy.hysteresis > 1 else 0
        self._growth = torch.full((), core.growth_tracker, dtype=torch.int32, device=device)
        self._overflow = torch.full((), overflow, dtype=torch.int32, device=device)
        self._counts = torch.zeros(2, dtype=torch.int64, device=device)
        self._last_clean = torch.full((), core.last_clean_scale, dtype=torch.float32, device=device)

    # -- back to the host --------------------------------------------------------------------------------------------
    def read(self, scale: torch.Tensor, extra: Optional[torch.Tensor] = None) -> list:
        """[scale, growth tracker, overflow counter, skipped, floor hits, last clean scale(, extra)] of the
        stretch, in one sync; changes nothing. Only while :attr:`lag` > 0."""
        parts = [scale, self._growth, self._overflow, *self._counts, self._last_clean]
        if extra is not None:
            parts.append(extra.to(scale.device))
        return torch.stack([t.double() for t in parts]).tolist()

    def reconcile(self, core: LossScaleState, scale: Optional[torch.Tensor], extra: Optional[torch.Tensor] = None):
        """Fold the device-decided steps into ``core`` (state and statistics) and end the stretch, reading
        ``extra`` (e.g. the next step's found_inf) in the same sync; returns its value (``None`` without)."""
        if self.lag == 0:
            return None if extra is None else extra.item()
        values = self.read(scale, extra)
        stats = core.stats
        core.scale = np.float32(values[0])
        core.growth_tracker, core.overflow_tracker = int(values[1]), int(values[2])
        skipped, floor_hits = int(values[3]), int(values[4])
        core.last_clean_scale = values[5]
        stats.total_steps += self.lag
        stats.skipped_steps += skipped
        stats.overflow_steps += skipped
        stats.floor_hits += floor_hits
        stats.scale_history.append(float(core.scale))  # one entry for the device-decided stretch
        self.discard()
        return values[6] if extra is not None else None

    def discard(self) -> None:
        """Forget the stretch (``load_state_dict`` replaces the state it would have folded back)."""
        self.lag = 0
        self._growth = self._overflow = self._counts = self._last_clean = None
