"""The AMP vocabulary every part of ampsafe checks against, stated once: the levels, whose autocast lists apply,
and what a scaler does at its floor. ``scan``, ``patch``, the tracers, the scalers and ``ampsafe run`` accept
exactly these. Pure Python (``ampsafe run``'s parent process reads it without numpy or a framework)."""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["LEVELS", "TARGETS", "ON_FLOOR", "check_level", "check_target"]

LEVELS = ("O1", "O2")  # O1: the framework's float16 op lists; O2: almost everything in float16
TARGETS = ("cuda", "cpu")  # whose autocast lists apply (a CPU scan of a GPU run uses "cuda")
ON_FLOOR = ("raise", "clamp", "heal")  # what a loss scaler does at its floor


def check_level(level) -> str:
    if level not in LEVELS:
        raise ConfigError(f"level must be 'O1' or 'O2', got {level!r}")
    return level


def check_target(target) -> str:
    if target not in TARGETS:
        raise ConfigError(f"target must be 'cuda' or 'cpu' (whose autocast lists apply), got {target!r}")
    return target
