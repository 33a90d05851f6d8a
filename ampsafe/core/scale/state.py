"""The loss-scale state machine both GradScalers share: policy (plain data), state, transitions, statistics.

Why a neutral core: torch's and Paddle's scalers differ only in how they move tensors. The decisions (when to
grow, when to back off, what to do at the floor) live here, in float32 arithmetic like both frameworks, so both
adapters behave identically and the property tests exercise one implementation.

Semantics (Paddle's ``decr_every_n_nan_or_inf`` for ``hysteresis``)::

    overflowing step: skipped; growth tracker := 0; overflow counter += 1;
                      when the counter reaches ``hysteresis``: scale := max(scale * backoff, min_scale), counter := 0
    clean step:       overflow counter := 0; growth tracker += 1;
                      when it reaches ``growth_interval``: scale := min(scale * growth, max_scale), tracker := 0
                      (a growth that would give a non-finite scale keeps the old one, as torch does)

A *floor hit* is an overflowing step taken while the scale already sits at ``min_scale`` (``min_scale > 0``):
no smaller scale is allowed, so the overflow can't be cured by backing off. ``on_floor`` (an :class:`OnFloor`)
says what then happens, in one dispatch of :class:`ScalerBase` (its docstring gives a step's order).

Data is never an overflow: a step whose non-finite gradients came with a non-finite model input (a NaN pixel, a
corrupt file) is skipped and nothing else changes: the scale, both trackers and the floor stay as they were
(:meth:`LossScaleState.skip_input`), whatever the precision. A bad sample says nothing about float16's range,
and backing off on it would let a few corrupt files decay the scale. It is counted apart
(``ScalerStats.input_steps``, ``StepDecision.bad_input``), never as an overflow, a floor hit or a heal's reason.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np

from ...errors import ConfigError
from ..amp import OnFloor
from ..sentinel import BadInput
from ..verdict import HealVerdict
from .policy import ScalePolicy

__all__ = [
    "LossScaleState",
    "StepDecision",
    "ScalerStats",
    "HealRecord",
    "HealPlan",
    "FloorInfo",
    "BelowFloor",
    "LOWEST_SCALE",
    "HISTORY",
]

HISTORY = 64  # scales kept in ScalerStats.scale_history
# The lowest scale a healing scaler moves its floor down to for a backward-only overflow: float16's smallest
# subnormal. Below it every scaled gradient element under 1 flushes to zero, so a backward that still overflows
# there is not a range problem any scale fixes.
LOWEST_SCALE = 2.0**-24


@dataclass(frozen=True)
class StepDecision:
    """The outcome of one :meth:`LossScaleState.update`: what the step did and what the scale became."""

    step: int
    found_inf: bool
    skipped: bool
    scale: float  # the scale the step ran with
    next_scale: float
    grew: bool
    backed_off: bool
    floor_hit: bool
    on_floor: OnFloor
    bad_input: Optional[BadInput] = None  # the non-finite model input of a step skipped for its data
    # the module whose gradient first went non-finite in this step's backward (an overflowing step of a scaler
    # that knows its model: :class:`~ampsafe.core.grad_origin.GradOrigin`); None when not measured
    grad_origin: Any = None

    @property
    def overflow(self) -> bool:
        """A step that overflowed (not one skipped for its data)."""
        return self.found_inf and self.bad_input is None


@dataclass(frozen=True)
class HealRecord:
    """One heal, as every reader sees it: the step, the module paths turned into FP32 islands, the scales around
    it, and what the heal hook found. :class:`~ampsafe.healing.Healer` keeps one per heal (``Healer.heals``; the
    scales are the scaler's to set, so there they are None) and the scaler records it with the scales it
    restarted from (``ScalerStats.heals``; a hook that returns only paths leaves the findings empty).

    ``found``: the path starts and risky-op modules the heal named (``paths`` is what islanding them turned into
    FP32 islands); ``ops``: the risky ops as ``module:op``; ``amax``: float32 max |value| per found path or op;
    ``reset_running_stats``: normalization layers whose non-finite statistics were reset; ``verdict``: the
    evidence the heal decided on; ``widened``: the engine's units among ``paths`` given float32 compute instead of
    an island (FSDP2 units a value past 65504 passes between, :meth:`~ampsafe.core.backend.Sharding.widen`).
    """

    step: int
    paths: tuple
    scale_before: Optional[float] = None
    scale_after: Optional[float] = None
    found: tuple = ()
    ops: tuple = ()
    amax: Mapping[str, Optional[float]] = field(default_factory=dict, hash=False)
    reset_running_stats: tuple = ()
    verdict: Optional[HealVerdict] = field(default=None, hash=False)
    widened: tuple = ()

    def to_dict(self) -> dict:
        """What reports read (``ScalerStats.to_dict``): the step, the islanded paths and the scales."""
        return {name: getattr(self, name) for name in ("step", "paths", "scale_before", "scale_after")}


@dataclass(frozen=True)
class HealPlan:
    """What a heal hook returns: the module paths it turned into FP32 islands and the scale to restart from
    (``None``: the scale of the last clean step, which a backward-only overflow may already have pulled down).
    ``record``: the hook's own :class:`HealRecord` of the heal, which the scaler completes with its scales."""

    paths: tuple
    restore_scale: Optional[float] = None
    record: Optional[HealRecord] = None


@dataclass(frozen=True)
class FloorInfo:
    """What a heal hook (``on_floor="heal"``) or a :class:`LossScaleFloorError` is told about a floor hit."""

    step: int
    offenders: tuple  # parameter names whose gradients were non-finite
    modules: tuple  # their module paths ("" = root)
    scale_before_collapse: float  # the scale of the last clean step
    scale_history: tuple
    scale_independent: Optional[bool]  # True: the loss itself was non-finite; None: unknown
    verdict: Optional[HealVerdict] = None  # what the replay of the last batch measured; None: not replayed
    # the module whose float16 inf the next ops swallowed on the overflowing steps that called this heal (the heal
    # rule's replay, :mod:`ampsafe.healing.trigger`); None when another rule called it
    swallowed: Optional[str] = None

    @property
    def where(self) -> Optional[str]:
        """The measured pass (:data:`ampsafe.core.verdict.WHERE`), None when nothing was measured."""
        return self.verdict.where if self.verdict is not None else None


@dataclass(frozen=True)
class BelowFloor:
    """The scale moved below the floor at ``step``: from ``floor`` to ``scale``, because the backward overflows at
    the floor and no FP32 island could take it (``reason``). ``module``: where the gradient overflowed;
    ``lost``: the fraction of the gradient's elements that flush to zero at the new scale, when measured."""

    step: int
    floor: float
    scale: float
    reason: str
    module: Optional[str] = None
    lost: Optional[float] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ScalerStats:
    """Counters for loggers: every field is cheap to read each step."""

    total_steps: int = 0
    skipped_steps: int = 0
    overflow_steps: int = 0
    floor_hits: int = 0
    scale_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    heals: list = field(default_factory=list)
    input_steps: int = 0  # skipped for a non-finite model input (data, not an overflow: the scale stayed)
    below_floor: list = field(default_factory=list)  # BelowFloor records: the floor moved down for the backward
    refusals: list = field(default_factory=list)  # (step, why) of each heal at the floor that healed nothing

    def to_dict(self) -> dict:
        names = ("total_steps", "skipped_steps", "overflow_steps", "floor_hits", "input_steps")
        counts = {name: getattr(self, name) for name in names}
        return {
            **counts,
            "scale_history": list(self.scale_history),
            "heals": [h.to_dict() for h in self.heals],
            "below_floor": [b.to_dict() for b in self.below_floor],
            "refusals": [list(r) for r in self.refusals],
        }


def _f32(x: float) -> np.float32:
    """``x`` rounded to float32; beyond float32's range it is ``inf``, as in the frameworks, without NumPy's
    overflow warning (a neutral scaler, ``max_scale=inf``, may grow past float32 and keep its old scale)."""
    with np.errstate(over="ignore"):
        return np.float32(x)


class LossScaleState:
    """Scale, growth tracker and consecutive-overflow counter, advanced by :meth:`update` once per step.

    Example::

        state = LossScaleState(ScalePolicy(init_scale=2.0**16, min_scale=1.0, hysteresis=2))
        decision = state.update(found_inf=True)   # skipped, no backoff yet (hysteresis 2)
    """

    def __init__(self, policy: ScalePolicy) -> None:
        self.policy = policy
        self.scale = _f32(policy.init_scale)
        self.growth_tracker = 0
        self.overflow_tracker = 0
        self.last_clean_scale = float(self.scale)
        self.stats = ScalerStats()
        self.callbacks: list[Callable[[StepDecision], Any]] = []
        # steps decided elsewhere (torch's on the device), folded into this state before its statistics are read
        self.pending: Optional[Callable[[], Any]] = None

    # -- transitions ---------------------------------------------------------------------------------------------
    def _times(self, factor: float) -> np.float32:
        if self.policy.product == "float64":
            return _f32(float(self.scale) * float(factor))
        with np.errstate(over="ignore"):
            return self.scale * _f32(factor)

    @property
    def at_floor(self) -> bool:
        """True when the scale can't back off any further (so the next overflow is a floor hit). The floor is
        ``min_scale`` as a float32 (what a backoff clamps to; above ``min_scale`` itself for, e.g., 0.1)."""
        p = self.policy
        return bool(p.dynamic and p.min_scale > 0 and self.scale <= _f32(p.min_scale))

    def update(self, found_inf: bool) -> StepDecision:
        """Advance one step. Never raises: the adapter decides what a floor hit means (it knows the offenders)."""
        p = self.policy
        before = float(self.scale)
        grew = backed_off = floor_hit = False
        found_inf = bool(found_inf)
        if found_inf:
            self.growth_tracker = 0
            if p.dynamic:
                floor_hit = self.at_floor
                self.overflow_tracker += 1
                if self.overflow_tracker >= p.hysteresis:
                    self.overflow_tracker = 0
                    new = self._times(p.backoff_factor)
                    if new < _f32(p.min_scale):
                        new = _f32(p.min_scale)
                    backed_off = new != self.scale
                    self.scale = new
        else:
            self.overflow_tracker = 0
            self.last_clean_scale = before
            if p.dynamic:
                self.growth_tracker += 1
                if self.growth_tracker >= p.growth_interval:
                    self.growth_tracker = 0
                    new = self._times(p.growth_factor)
                    if np.isfinite(new):
                        if new > _f32(p.max_scale):
                            new = _f32(p.max_scale)
                        grew = new != self.scale
                        self.scale = new
        self.stats.overflow_steps += found_inf
        self.stats.floor_hits += floor_hit
        return self._counted(before, found_inf, grew=grew, backed_off=backed_off, floor_hit=floor_hit)

    def skip_input(self, bad_input: BadInput) -> StepDecision:
        """Record a step skipped for its data (``bad_input``: the non-finite model input): the scale, the trackers
        and the last clean scale stay as they were (see the module docstring)."""
        self.stats.input_steps += 1
        return self._counted(float(self.scale), True, bad_input=bad_input)

    def _counted(
        self,
        before: float,
        found_inf: bool,
        *,
        grew: bool = False,
        backed_off: bool = False,
        floor_hit: bool = False,
        bad_input: Optional[BadInput] = None,
    ) -> StepDecision:
        """Count one decided step (scale ``before`` it; a non-finite step is skipped) and say what was decided."""
        s = self.stats
        s.total_steps += 1
        s.skipped_steps += found_inf
        s.scale_history.append(before)
        return StepDecision(
            step=s.total_steps - 1,
            found_inf=found_inf,
            skipped=found_inf,
            scale=before,
            next_scale=float(self.scale),
            grew=grew,
            backed_off=backed_off,
            floor_hit=floor_hit,
            on_floor=self.policy.on_floor,
            bad_input=bad_input,
        )

    def set_scale(self, value: float) -> None:
        """Set the scale by hand (``update(new_scale=...)``); the trackers are left as they are, as in torch."""
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"a loss scale must be finite and > 0 (got {value})")
        self.scale = _f32(value)

    def heal(self, step: int, plan: HealPlan) -> HealRecord:
        """Record a heal and restart from the scale before the collapse (or ``plan.restore_scale``)."""
        before = float(self.scale)
        target = self.last_clean_scale if plan.restore_scale is None else plan.restore_scale
        target = min(max(float(target), self.policy.min_scale), self.policy.max_scale)
        self.scale = _f32(target)
        self.growth_tracker = self.overflow_tracker = 0
        scales = {"step": step, "paths": tuple(plan.paths), "scale_before": before, "scale_after": float(self.scale)}
        record = replace(plan.record, **scales) if plan.record is not None else HealRecord(**scales)
        self.stats.heals.append(record)
        return record

    def lower_floor(self, step: int, reason: str, module: Optional[str] = None, lost=None) -> Optional[BelowFloor]:
        """Move the floor and the scale one backoff below the floor (a backward-only overflow that no island takes:
        what the framework's own scaler would do next); None when that would pass :data:`LOWEST_SCALE`."""
        p = self.policy
        new = self._times(p.backoff_factor)
        if not new >= _f32(LOWEST_SCALE):
            return None
        record = BelowFloor(step, float(self.scale), float(new), reason, module, lost(float(new)) if lost else None)
        self.policy = replace(p, min_scale=float(new))
        self.scale = new
        self.growth_tracker = self.overflow_tracker = 0
        self.stats.below_floor.append(record)
        return record

    # -- persistence -------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        """A pickled state carries policy, scale, trackers and statistics; not the callbacks (this process's
        loggers: add them again after loading) nor ``pending`` (the adapter sets it again)."""
        state = self.__dict__.copy()
        state["callbacks"] = []
        state["pending"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("pending", None)
        self.policy.on_floor = OnFloor.parse(self.policy.on_floor)  # a state pickled with the string loads

    def state_dict(self) -> dict:
        """The scaling state a checkpoint resumes from. The run's records (:class:`ScaleStats`: steps, skips,
        floor hits, heals) are not in it: a script that reloads a checkpoint mid-run keeps counting."""
        p = self.policy
        return {
            "scale": float(self.scale),
            "growth_factor": p.growth_factor,
            "backoff_factor": p.backoff_factor,
            "growth_interval": p.growth_interval,
            "_growth_tracker": self.growth_tracker,
            "min_scale": p.min_scale,
            "max_scale": p.max_scale,
            "hysteresis": p.hysteresis,
            "on_floor": p.on_floor.value,
            "_overflow_tracker": self.overflow_tracker,
            "_last_clean_scale": self.last_clean_scale,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Load ampsafe's keys, or only torch's five (the extras then keep their current values)."""
        p = self.policy
        changes = {
            k: sd[k]
            for k in ("growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale", "hysteresis")
            if k in sd
        }
        if "on_floor" in sd:
            changes["on_floor"] = sd["on_floor"]
        bounds = {"min_scale": p.min_scale, "max_scale": p.max_scale, **changes}
        loaded = float(sd.get("scale", p.init_scale))
        # a loaded scale outside the bounds is kept as loaded (as update(new_scale) keeps one): no clamp, no warning
        init = min(max(loaded, bounds["min_scale"]), bounds["max_scale"]) if loaded > 0 else p.init_scale
        candidate = ScalePolicy(**{**asdict(p), **changes, "init_scale": init})
        self.policy = candidate
        self.scale = _f32(sd.get("scale", float(self.scale)))
        self.growth_tracker = int(sd.get("_growth_tracker", 0))
        self.overflow_tracker = int(sd.get("_overflow_tracker", 0))
        self.last_clean_scale = float(sd.get("_last_clean_scale", float(self.scale)))
