"""The loss-scale policy: plain data (the floor, the cap, the hysteresis, what happens at the floor), validated once,
and the accessors that let each framework's spelling of a field read and set the one policy."""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ...errors import ConfigError
from ..amp import OnFloor

__all__ = [
    "ScalePolicy",
    "policy_for",
    "clamp_initial_scale",
    "clampable",
    "policy_methods",
    "policy_property",
    "SCALE_NAMES",
]


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
