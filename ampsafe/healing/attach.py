"""``ampsafe.heal``: attach a :class:`~ampsafe.healing.healer.Healer` to a scaler, or heal a model now."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from .._framework import backend_of
from ..core.amp import OnFloor
from ..errors import ConfigError
from .healer import Healer
from .scaler import HealingScaler, check_patience

__all__ = ["heal"]


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
    overflow skips every step whatever the scale, so halving down to the floor only loses steps). The scaler
    counts them (:meth:`HealingScaler.attach_patience`, as its own ``patience=``, which wins when both are set):
    the overflows the host knows of (torch on CUDA decides steps on the device and tells the host only now and
    then).
    """
    check_patience(patience)
    if scaler is None and batch_fn is None:
        raise ConfigError("ampsafe.heal needs a scaler to attach to (scaler=...) or a batch_fn returning inputs")
    on_floor = OnFloor.parse(getattr(getattr(scaler, "policy", None), "on_floor", OnFloor.HEAL))
    if on_floor is not OnFloor.HEAL:
        raise ConfigError(f"the scaler was built with on_floor={on_floor.value!r}; build it with on_floor='heal'")
    healer = Healer(
        model,
        backend=backend_of(model),
        level=level,
        target=target,
        margin_bits=margin_bits,
        max_heals=max_heals,
        loss_fn=loss_fn,
    )
    if scaler is not None:
        reason = getattr(scaler, "disabled_reason", None)
        if reason:  # a disabled scaler never skips a step, so it never reaches its floor: heal would never run
            warnings.warn(f"ampsafe.heal: the scaler is {reason}: it never reaches its floor, so nothing is healed")
        if patience is not None and not isinstance(scaler, HealingScaler):
            healer.detach()
            raise ConfigError(
                f"patience needs an ampsafe GradScaler (ampsafe.torch / ampsafe.paddle), got {type(scaler).__name__}"
            )
        scaler.heal_hook = healer
        if patience is not None:
            scaler.attach_patience(patience)
        return healer
    healer.detach()
    healer.last_inputs = batch_fn()
    return list(healer(None, None).paths)
