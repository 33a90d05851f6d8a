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

import gc
import math
import sys
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from ..errors import ConfigError, LossScaleFloorError
from .amp import ON_FLOOR, OnFloor
from .modpath import parent
from .sentinel import BadInput
from .verdict import HealVerdict

__all__ = [
    "ScalePolicy",
    "LossScaleState",
    "clamp_initial_scale",
    "policy_for",
    "StepDecision",
    "ScalerStats",
    "HealRecord",
    "HealPlan",
    "FloorInfo",
    "BelowFloor",
    "LOWEST_SCALE",
    "OnFloor",
    "ON_FLOOR",
    "floor_message",
    "floor_error",
    "names_from_live_modules",
    "clampable",
    "policy_methods",
    "policy_property",
    "ScalerBase",
]

HISTORY = 64  # scales kept in ScalerStats.scale_history
# The lowest scale a healing scaler moves its floor down to for a backward-only overflow: float16's smallest
# subnormal. Below it every scaled gradient element under 1 flushes to zero, so a backward that still overflows
# there is not a range problem any scale fixes.
LOWEST_SCALE = 2.0**-24


@dataclass
class ScalePolicy:
    """What the scaler may do. ``product``: how ``scale * factor`` is rounded to float32: ``"float64"`` (exact
    product rounded once, as torch's ``_amp_update_scale_``) or ``"float32"`` (factor cast to float32 first, as
    Paddle's ``scale * ratio``). ``dynamic=False`` keeps the scale fixed (Paddle's
    ``use_dynamic_loss_scaling=False``, ampsafe's FP32 guard) while still skipping non-finite steps."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    hysteresis: int = 1
    on_floor: OnFloor = OnFloor.RAISE  # a member or its string ("raise", "clamp", "heal")
    dynamic: bool = True
    product: str = "float64"

    def __post_init__(self) -> None:
        self.validate()
        self.on_floor = OnFloor.parse(self.on_floor)
        if self.dynamic:
            self.init_scale = clamp_initial_scale(self.init_scale, self.min_scale, self.max_scale)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the bad field and what it must be."""
        problems = []
        if not self.growth_factor > 1.0:
            problems.append(f"growth_factor must be > 1.0 (got {self.growth_factor})")
        if not 0.0 < self.backoff_factor < 1.0:
            problems.append(f"backoff_factor must be in (0, 1) (got {self.backoff_factor})")
        if int(self.growth_interval) != self.growth_interval or self.growth_interval < 1:
            problems.append(f"growth_interval must be an integer >= 1 (got {self.growth_interval})")
        if int(self.hysteresis) != self.hysteresis or self.hysteresis < 1:
            problems.append(f"hysteresis must be an integer >= 1 (got {self.hysteresis})")
        if math.isnan(self.min_scale) or self.min_scale < 0 or math.isinf(self.min_scale):
            problems.append(f"min_scale must be finite and >= 0 (got {self.min_scale})")
        if math.isnan(self.max_scale) or self.max_scale <= 0:
            problems.append(f"max_scale must be > 0 (got {self.max_scale})")
        if not problems and self.min_scale > self.max_scale:
            problems.append(f"min_scale ({self.min_scale}) must be <= max_scale ({self.max_scale})")
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            problems.append(f"the initial scale must be finite and > 0 (got {self.init_scale})")
        try:
            OnFloor.parse(self.on_floor)
        except ConfigError as exc:
            problems.append(str(exc))
        if self.product not in ("float64", "float32"):
            problems.append(f"product must be 'float64' or 'float32' (got {self.product!r})")
        if problems:
            raise ConfigError("invalid loss-scale policy: " + "; ".join(problems))


def policy_for(active: bool, names: Optional[tuple] = None, **fields) -> ScalePolicy:
    """The :class:`ScalePolicy` of a scaler: validated when the scaler is ``active``; for a disabled one, whatever
    the framework's disabled scaler accepts is accepted (a bad field falls back to its default, silently), since
    a disabled scaler never uses its policy. An active dynamic scaler's initial scale outside its bounds is
    clamped with the warning in the caller's ``names`` (:func:`clamp_initial_scale`)."""
    if active:
        low, high, init = fields["min_scale"], fields["max_scale"], fields["init_scale"]
        if fields.get("dynamic", True) and clampable(init, low, high):
            fields["init_scale"] = clamp_initial_scale(init, low, high, names or SCALE_NAMES)
        return ScalePolicy(**fields)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ScalePolicy(**fields)
        except (ConfigError, TypeError, ValueError):
            keep = {k: fields[k] for k in ("on_floor", "product") if k in fields}
            try:
                return ScalePolicy(**keep)
            except ConfigError:
                return ScalePolicy(product=keep.get("product", "float64"))


SCALE_NAMES = ("init_scale", "min_scale", "max_scale")


def clamp_initial_scale(init: float, min_scale: float, max_scale: float, names: tuple = SCALE_NAMES) -> float:
    """``init`` clamped into ``[min_scale, max_scale]``, with one warning that says so and how to widen the bound.

    Why clamp and not refuse: the frameworks accept any positive initial scale (torch's own tests start at 1e38),
    so a script or library that starts high must still build ampsafe's scaler; the floor and cap are what
    ampsafe promises, and they hold from the first step. ``names``: the caller's spelling of the three
    arguments (``init_loss_scaling``, ``min_loss_scaling``, ``max_loss_scaling`` for Paddle).
    """
    init = float(init)
    if min_scale <= init <= max_scale:
        return init
    init_name, min_name, max_name = names
    if init > max_scale:
        bound, side, name = float(max_scale), "above", max_name
    else:
        bound, side, name = float(min_scale), "below", min_name
    widen = "float('inf')" if side == "above" else "0"
    warnings.warn(
        f"{init_name}={init!r} lies {side} {name}={bound!r}: the scale starts at {bound!r}. To start at "
        f"{init!r}, pass {name}={init!r} (or {name}={widen}, the framework's unbounded scale).",
        UserWarning,
        stacklevel=_user_stacklevel(),
    )
    return bound


def clampable(init, low, high) -> bool:
    """The bounds and the initial scale are numbers the policy accepts (else the policy names what is wrong)."""
    numbers = all(isinstance(v, (int, float, np.floating, np.integer)) for v in (init, low, high))
    return numbers and 0 <= low <= high and np.isfinite(init) and init > 0


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside ampsafe: the warning points at the line that built the scaler."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "ampsafe":
        frame, level = frame.f_back, level + 1
    return level


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
    evidence the heal decided on.
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
        loggers: add them again after loading)."""
        state = self.__dict__.copy()
        state["callbacks"] = []
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
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


def floor_message(info: FloorInfo, min_scale: float, hysteresis: int, heal_failed: Optional[str] = None) -> str:
    """The sentence a :class:`LossScaleFloorError` carries: where (as measured), how the scale fell, what to do.

    ``info.verdict`` is what the replay of the last batch measured (a :class:`HealVerdict`); without one
    the pass is said to be unknown, never inferred from the loss. ``heal_failed``: why a heal did not heal
    (``""``: no reason known); None when no heal was tried, and then the advice fits the measured pass.
    """
    named = (
        ", ".join(f"{name} (module {mod!r})" for name, mod in zip(info.offenders[:8], info.modules[:8]))
        or "none on this process (they were on another rank, or in no gradient the optimizers hold)"
    )
    if len(info.offenders) > 8:
        named += f" and {len(info.offenders) - 8} more"
    history = ", ".join(f"{s:g}" for s in info.scale_history[-12:])
    if info.verdict is not None:
        where = f"Replayed under ampsafe.watch, the last batch overflows in {info.verdict.text}."
        if info.where == "not replayed":
            where = f"The last batch was {info.verdict.text}."
    else:
        where = "Which pass overflowed was not measured (no replay of the last batch)."
    return (
        f"loss scale reached its floor min_scale={min_scale:g} at step {info.step} and gradients still overflow "
        f"(hysteresis={hysteresis}). Non-finite gradients: {named}. Recent scales: [{history}]. {where} "
        + _advice(info.where, heal_failed)
    )


def _advice(where: Optional[str], heal_failed: Optional[str]) -> str:
    """What to do, fitted to the measured pass and to what was tried."""
    if heal_failed is not None:
        return (
            f"on_floor='heal' could not heal it: {heal_failed}" if heal_failed else "on_floor='heal' could not heal it."
        )
    fix = {
        "forward": "No loss scale fixes a forward overflow: keep that path in float32 (ampsafe.patch(model, "
        "inputs, paths=[...]) or policy='island'), or on_floor='heal' to island it and go on.",
        "loss": "Compute the loss in float32 (outside autocast), or guard the op that overflows in it.",
        "data": "Fix or drop that sample (ampsafe.check_targets / ampsafe.core.targets.checked); no loss scale "
        "or FP32 island fixes bad data.",
        "backward": "A smaller scale is not allowed: lower min_scale, keep the named layers in float32 "
        "(ampsafe.scan(model, inputs, loss_fn=...) finds the gradient paths), or on_floor='clamp' to keep "
        "skipping such steps.",
    }.get(where or "")
    return fix or "Use on_floor='clamp' to keep skipping such steps, or on_floor='heal' to island the offending paths."


def floor_error(
    info: FloorInfo, policy: ScalePolicy, prefix: str = "", heal_failed: Optional[str] = None
) -> LossScaleFloorError:
    """The :class:`LossScaleFloorError` for a floor hit (``.modules`` and ``.info`` let ``ampsafe.heal`` act)."""
    err = LossScaleFloorError(
        prefix + floor_message(info, policy.min_scale, policy.hysteresis, heal_failed),
        offenders=info.offenders,
        scale_history=info.scale_history,
        scale_independent=info.scale_independent,
    )
    err.modules = list(info.modules)
    err.info = info
    return err


def names_from_live_modules(module_type: type, wrappers=frozenset()) -> dict[int, str]:
    """id(parameter) -> the longest name any live ``module_type`` (not a wrapper class named in ``wrappers``)
    gives it, i.e. the root model's name. Walks the garbage collector: only for the rare floor path."""
    names: dict[int, str] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), module_type) and type(obj).__name__ not in wrappers:
            try:
                items = obj.named_parameters()
            except Exception:  # a half-built module: nothing to name
                continue
            for name, p in items:
                if len(name) > len(names.get(id(p), "")):
                    names[id(p)] = name
    return names


def policy_methods(name: str) -> tuple[Callable, Callable]:
    """A getter and a setter of the policy field ``name``: the frameworks' ``get_*`` / ``set_*`` (torch's
    ``get_growth_factor``, Paddle's ``set_incr_ratio``), written once over the scaler's one policy."""

    def get(self):
        return getattr(self._core.policy, name)

    def set(self, value) -> None:
        self._set_policy(**{name: value})

    get.__doc__, set.__doc__ = f"The policy's ``{name}``.", f"Set the policy's ``{name}``."
    return get, set


def policy_property(name: str) -> property:
    """The policy field ``name`` under a framework's private attribute (torch's ``_growth_factor``, Paddle's
    ``_incr_ratio``): the framework's own code reads and sets the one policy."""
    return property(*policy_methods(name))


class ScalerBase:
    """The step's end, the floor dispatch and the policy accessors both GradScaler adapters share around
    :class:`LossScaleState`: the adapters only move tensors.

    A step ends in one place, :meth:`_end_update` (``update()``; Paddle's ``minimize`` and fixed-scale ``step``)::

        gather       the adapter: found_inf (its one host sync), the offenders when at the floor, the losses
                     ``scale()`` saw; None when there is nothing to decide (``update(new_scale)``, a step
                     decided on the device, nothing stepped)
        data         found_inf with a non-finite model input (``_bad_input()``, checked only on such steps):
                     LossScaleState.skip_input, no dispatch (data is never an overflow: module docstring)
        decide       LossScaleState.update(found_inf) -> StepDecision; the adapter's scale tensor follows
        dispatch     FLOOR_HANDLERS[decision.on_floor](decision, offenders, losses), the one place on_floor acts:
                       RAISE  a floor hit raises LossScaleFloorError naming the offenders and the measured pass
                       CLAMP  nothing: the scale stays at the floor and the overflowing steps are skipped
                       HEAL   a floor hit replays the batch, calls the heal hook and restarts from its scale (or
                              raises what it measured); above the floor, ``patience`` (HealingScaler)
        observe      every ``add_step_callback(fn)``: fn(decision), in the order added, after the dispatch (a
                     heal has restored the scale), also when the dispatch raised (a step the floor stopped is
                     still a step the loggers see); an observer that raises ends the step with its own error
        end          ``_end_step()``: the step's inputs are no longer the latest (also when anything raised)

    Adapters call :meth:`_init_core` (the policy, ``callback=``, ``model=``) and supply ``_backend()`` (their
    framework's Backend), ``_refresh_scale()`` (copy ``_core.scale`` into their scale tensor) and ``_wrappers``
    (module classes that only wrap a model, skipped when parameters are named from the live modules).
    """

    FLOOR_HANDLERS: ClassVar[dict[OnFloor, str]] = {
        OnFloor.RAISE: "_raise_at_floor",
        OnFloor.CLAMP: "_clamp_at_floor",
        OnFloor.HEAL: "_heal",
    }
    _core: LossScaleState
    _model: Any = None
    _wrappers: ClassVar[frozenset] = frozenset()
    heal_hook: Optional[Callable] = None

    def _init_core(self, policy: ScalePolicy, callback: Optional[Callable] = None, model=None) -> None:
        """The state machine of ``policy``, the ``callback=`` observer and ``model=`` (names parameters)."""
        self._core = LossScaleState(policy)
        if callback is not None:
            self.add_step_callback(callback)
        self._model = model
        self.heal_hook = None
        self.metric_sources: list = []  # what else amp_metrics reads (each ``.metrics()``): the run's sampler

    @property
    def policy(self) -> ScalePolicy:
        return self._core.policy

    @property
    def stats(self) -> ScalerStats:
        """total/skipped/overflow steps, floor hits, the recent scales and the heals."""
        self._reconcile()
        return self._core.stats

    def add_step_callback(self, fn: Callable[[StepDecision], Any]) -> None:
        """Call ``fn(decision)`` after every update, once the floor is dispatched (loggers: VisualDL, TensorBoard;
        ``ampsafe run``'s report and ``--watch``)."""
        self._core.callbacks.append(fn)

    def _set_policy(self, **changes) -> None:
        self._core.policy = replace(self._core.policy, **changes)

    # -- one step's end -------------------------------------------------------------------------------------------
    def _end_update(self, gather: Callable[[], Optional[tuple]]) -> Optional[StepDecision]:
        """Gather the step (``gather()``: ``(found_inf, offenders, losses)`` or None), decide it, dispatch the
        floor and tell the observers, in the order of the class docstring."""
        try:
            step = gather()
            return None if step is None else self._decide(*step)
        finally:
            self._end_step()

    def _decide(self, found_inf: bool, offenders: list, losses: list) -> StepDecision:
        bad_input = self._bad_input() if found_inf else None
        before = self._core.scale
        decision = self._core.update(found_inf) if bad_input is None else self._core.skip_input(bad_input)
        if self._core.scale != before:
            self._refresh_scale()
        if bad_input is None:
            decision = self._annotated(decision, offenders)
        try:
            if bad_input is None:
                getattr(self, self.FLOOR_HANDLERS[decision.on_floor])(decision, offenders, losses)
            else:
                self._skipped_input(decision)
        finally:
            for observe in list(self._core.callbacks):
                observe(decision)
        return decision

    def _raise_at_floor(self, decision: StepDecision, offenders: list, losses: list) -> None:
        if decision.floor_hit:
            raise floor_error(self._measured(self.floor_info(decision.step, offenders, losses)), self._core.policy)

    def _clamp_at_floor(self, decision: StepDecision, offenders: list, losses: list) -> None:
        """Nothing to do: the state machine keeps the scale at the floor and the step was skipped."""

    def _heal(self, decision: StepDecision, offenders: list, losses: list) -> None:
        if decision.floor_hit:
            self._heal_at_floor(decision, offenders, losses)

    def _heal_at_floor(self, decision: StepDecision, offenders: list, losses: list) -> None:
        """Measure the floor, ask the heal hook, restart from its scale; raise what was measured when it can't."""
        hook = self.heal_hook if self.heal_hook is not None else self._builtin_heal_hook()
        info = self._measured(self.floor_info(decision.step, offenders, losses), magnitude=not self._scans(hook))
        policy = self._core.policy
        if hook is None:
            raise floor_error(info, policy, heal_failed=self._no_heal_reason())
        try:
            plan = hook(self, info)
        except LossScaleFloorError as exc:
            why = str(exc).removeprefix("not healed: ")
            verdict = getattr(exc, "verdict", None)  # the hook's own findings added to the measured verdict
            if verdict is not None:
                info = replace(info, verdict=verdict)
            raise floor_error(info, policy, heal_failed=why) from exc
        self.apply_heal(decision.step, plan, info)

    # -- the floor's facts ----------------------------------------------------------------------------------------
    def floor_info(self, step: int, offenders: list = (), losses: list = ()) -> FloorInfo:
        """What a heal hook is told: ``offenders`` are (parameter, fallback label) pairs whose gradients were
        non-finite, ``losses`` the losses ``scale()`` saw this step (to tell a non-finite loss apart)."""
        names = self._param_names() if offenders else {}
        labelled = [names.get(id(p), label) for p, label in self._order_offenders(offenders)]
        independent = None
        if losses:
            finite = self._backend().tensors.finite
            independent = not all(finite(loss) for loss in losses)
        return FloorInfo(
            step=step,
            offenders=tuple(labelled),
            modules=tuple(parent(name) for name in labelled),
            scale_before_collapse=self._core.last_clean_scale,
            scale_history=tuple(self._core.stats.scale_history),
            scale_independent=independent,
        )

    def apply_heal(self, step: int, plan, info: Optional[FloorInfo] = None) -> HealRecord:
        """Record what a heal hook did (a :class:`HealPlan`, or just the healed module paths) and restart from
        its scale (default: the scale of the last clean step). Also for hooks that heal off the floor."""
        if not isinstance(plan, HealPlan):
            plan = HealPlan(tuple(plan or ()))
        if not plan.paths:
            raise floor_error(
                info or self.floor_info(step), self._core.policy, "The heal hook healed nothing. ", heal_failed=""
            )
        record = self._core.heal(step, plan)
        self._refresh_scale()
        return record

    def _param_names(self) -> dict[int, str]:
        """id(parameter) -> qualified name, from ``model`` or else every live module (rare path only)."""
        if self._model is not None:
            return {id(p): n for n, p in self._model.named_parameters()}
        return names_from_live_modules(self._backend().module_type, self._wrappers)

    # -- what adapters with a model refine (``ampsafe.healing.scaler.HealingScaler``) -----------------------------------
    def _measured(self, info: FloorInfo, magnitude: bool = True) -> FloorInfo:
        """``info`` with the measured verdict of the floor (here: none, nothing to replay)."""
        return info

    def _bad_input(self) -> Optional[BadInput]:
        """The non-finite input of this step's forward (None: finite, or no forward was seen)."""
        return None

    def _annotated(self, decision: StepDecision, offenders: list) -> StepDecision:
        """``decision`` with what the step's backward measured (here: nothing; a scaler that knows its model
        names the module whose gradient first went non-finite)."""
        return decision

    def _names_offenders(self) -> bool:
        """Whether an overflow of the step now ending is dispatched as a floor (the adapters then name the
        parameters whose gradients are non-finite, while those still exist): at the floor."""
        return self._core.at_floor

    def _skipped_input(self, decision: StepDecision) -> None:
        """A step skipped for its data (here: nothing more to do)."""

    def _scans(self, hook: Optional[Callable]) -> bool:
        """Whether ``hook`` scans the batch itself (then the floor's replay leaves the magnitude to it)."""
        return False

    def _builtin_heal_hook(self) -> Optional[Callable]:
        """The heal hook ``on_floor='heal'`` uses when none is set (here: none)."""
        return None

    def _no_heal_reason(self) -> str:
        return "no heal hook is set (ampsafe.heal(model, scaler=scaler) sets one)"

    def _order_offenders(self, offenders: list) -> list:
        """(parameter, label) pairs in the order the error names them."""
        return list(offenders)

    def _end_step(self) -> None:
        """After ``update()``, whatever happened (here: nothing to forget)."""

    def _reconcile(self, extra=None):
        """Bring steps the host does not know yet into ``_core`` (here: none; torch's device-decided steps)."""
        return None

    # -- pickling: the state travels, the hooks stay ----------------------------------------------------------------
    MID_ITERATION = (
        "A GradScaler instance may only be pickled at the beginning of an iteration, or at the end after "
        "scaler.update()."
    )

    def __getstate__(self) -> dict:
        """What ``pickle`` (also ``copy.deepcopy``, ``torch.save(scaler)``) carries: the policy, the scale, the
        trackers and the statistics, never the training loop around them. Left behind (they would drag the model
        into the pickle, or can't be pickled at all): ``model=``, the step callbacks, ``heal_hook`` (and the
        patience ``ampsafe.heal(..., patience=)`` attached) and methods wrapped on the instance (``ampsafe run
        --watch``). After loading the
        scaler works; it names parameters from the live modules as without ``model=``. Re-attach what you
        need: ``add_step_callback(fn)``, ``ampsafe.heal(model, scaler=scaler)``."""
        state = {
            name: value
            for name, value in self.__dict__.items()
            if not callable(getattr(type(self), name, None))  # an instance-level wrapper of a method
        }
        state["_model"] = None
        state["heal_hook"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _backend(self):  # pragma: no cover - adapters
        raise NotImplementedError

    def _refresh_scale(self) -> None:  # pragma: no cover - adapters
        raise NotImplementedError
