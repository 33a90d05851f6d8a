"""``ampsafe.heal``: attach a :class:`~ampsafe.healing.healer.Healer` to a scaler, or heal a model now."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from ..errors import ConfigError
from .healer import Healer

__all__ = ["heal"]


def _heal_on_streak(scaler, healer: Healer, patience: int) -> None:
    """Wrap ``scaler.update`` (on the instance) to heal after ``patience`` overflowing steps in a row."""
    original = scaler.update
    streak = [0]
    in_range = [False]  # the last check found the forward in range: wait for a clean step before checking again

    def update(*args, **kwargs):
        stats = scaler.stats
        overflows, heals = stats.overflow_steps, len(stats.heals)
        result = original(*args, **kwargs)
        if len(stats.heals) > heals or stats.overflow_steps == overflows:
            streak[0], in_range[0] = 0, False  # healed at the floor, or a clean step
            return result
        streak[0] += 1
        if streak[0] >= patience and not in_range[0]:
            streak[0] = 0
            step = stats.total_steps - 1
            info = scaler.floor_info(step)
            plan = healer(scaler, info, off_floor=True)
            if plan is None:
                in_range[0] = True
            else:
                scaler.apply_heal(step, plan, info)
        return result

    update.__doc__ = original.__doc__
    scaler.update = update


def heal(
    model,
    batch_fn: Optional[Callable[[], Any]] = None,
    *,
    scaler=None,
    level: str = "O1",
    target: str = "cuda",
    margin_bits: float = 1.0,
    max_heals: int = 3,
    loss_fn=None,
    patience: Optional[int] = None,
):
    """Attach self-healing to ``scaler``, or heal ``model`` now on the batch ``batch_fn()`` returns.

    With ``scaler`` (an ampsafe GradScaler built with ``on_floor="heal"``): installs a :class:`Healer` as its
    ``heal_hook`` and returns it; at the floor it replays the last batch, islands the overflowing paths and the
    scaler restarts from the scale before the collapse. Without: ``batch_fn()`` gives ``example_inputs`` for
    ``model(...)``; the overflowing paths are islanded at once and their module paths returned.

    ``patience``: also heal after that many overflowing steps in a row, without waiting for the floor (a forward
    overflow skips every step whatever the scale, so halving down to the floor only loses steps). It watches
    ``scaler.update()`` (Paddle's ``minimize`` bypasses it: use ``step`` + ``update``) and counts the overflows
    the host knows of (torch on CUDA decides steps on the device and tells the host only now and then).
    """
    if patience is not None and (not isinstance(patience, int) or patience < 1):
        raise ConfigError(f"patience must be an int >= 1 (overflowing steps in a row) or None, got {patience!r}")
    if scaler is None and batch_fn is None:
        raise ConfigError("ampsafe.heal needs a scaler to attach to (scaler=...) or a batch_fn returning inputs")
    healer = Healer(model, level=level, target=target, margin_bits=margin_bits, max_heals=max_heals, loss_fn=loss_fn)
    if scaler is not None:
        policy = getattr(scaler, "policy", None)
        if policy is not None and getattr(policy, "on_floor", "heal") != "heal":
            healer.detach()
            raise ConfigError(f"the scaler was built with on_floor={policy.on_floor!r}; build it with on_floor='heal'")
        reason = getattr(scaler, "disabled_reason", None)
        if reason:  # a disabled scaler never skips a step, so it never reaches its floor: heal would never run
            warnings.warn(f"ampsafe.heal: the scaler is {reason}: it never reaches its floor, so nothing is healed")
        scaler.heal_hook = healer
        if patience is not None and getattr(scaler, "_patience", None) is None:  # else the scaler counts itself
            _heal_on_streak(scaler, healer, patience)
        return healer
    healer.detach()
    healer.last_inputs = batch_fn()
    return list(healer(None, None).paths)
