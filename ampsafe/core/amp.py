"""The AMP vocabulary every part of ampsafe checks against, stated once: the levels, whose autocast lists apply,
and what a scaler does at its floor. ``scan``, ``patch``, the tracers, the scalers and ``ampsafe run`` accept
exactly these. Pure Python (``ampsafe run``'s parent process reads it without numpy or a framework)."""

from __future__ import annotations

import enum

from ..errors import ConfigError

__all__ = ["LEVELS", "TARGETS", "OnFloor", "ON_FLOOR", "check_level", "check_target"]

LEVELS = ("O1", "O2")  # O1: the framework's float16 op lists; O2: almost everything in float16
TARGETS = ("cuda", "cpu")  # whose autocast lists apply (a CPU scan of a GPU run uses "cuda")


class OnFloor(str, enum.Enum):
    """What a loss scaler does at its floor (an overflow it may not back off from any further).

    A ``str`` enum, as torch's ``OptState`` is an enum: users pass the strings (``on_floor="heal"``), the scalers
    hold members, and a member equals its string, so a state dict that stores ``.value`` loads either way.
    ``RAISE``: :class:`~ampsafe.LossScaleFloorError` naming the offenders; ``CLAMP``: stay at the floor and keep
    skipping; ``HEAL``: replay the batch, island what overflows, restore the scale (and ``patience``).
    """

    RAISE = "raise"
    CLAMP = "clamp"
    HEAL = "heal"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # f"{OnFloor.HEAL}" is "heal"

    @property
    def acts_at_floor(self) -> bool:
        """Whether a floor hit needs the scaler's host side: RAISE and HEAL act on it (naming the offenders,
        replaying the batch); CLAMP only keeps skipping, which the state machine does on its own."""
        return self is not OnFloor.CLAMP

    @classmethod
    def parse(cls, value) -> OnFloor:
        """``value`` (a member or its string) as a member; :class:`ConfigError` naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"on_floor must be one of {', '.join(ON_FLOOR)}, got {value!r}") from None


ON_FLOOR = tuple(member.value for member in OnFloor)  # the strings options and the command line accept


def check_level(level) -> str:
    if level not in LEVELS:
        raise ConfigError(f"level must be 'O1' or 'O2', got {level!r}")
    return level


def check_target(target) -> str:
    if target not in TARGETS:
        raise ConfigError(f"target must be 'cuda' or 'cpu' (whose autocast lists apply), got {target!r}")
    return target
