"""``ampsafe.watch``: name the op, the pass and the sample of the first NaN/Inf, and warn before float16 overflows.

::

    with ampsafe.watch(model) as w:                 # full hooks: every op output and gradient is checked
        loss = criterion(model(x), y)                # raises NonFiniteError at the origin op
        loss.backward()

    with ampsafe.watch(model, guard=True) as w:     # cheap: only the loss and gradient norms, one host sync
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            if not w.check(loss, replay=lambda: criterion(model(x), y)):   # hit: replayed with full hooks
                optimizer.zero_grad()
                continue                            # (with on_nonfinite="record"; "raise" raises here)
            optimizer.step()
            optimizer.zero_grad()

``monitor_every=N`` measures the abs-max of the unnormalized paths ``ampsafe.scan`` finds every N forward
passes and warns (logging, ``callback``, ``w.warnings``) when one has less than ``margin_bits`` of float16
headroom left. When the block exits, successfully or not, no hook is left on the model.
"""

from __future__ import annotations

from typing import Callable

from ._framework import backend_of
from .core.model import unwrap
from .scanner import scan

__all__ = ["watch"]


def watch(
    model,
    *,
    on_nonfinite: str = "raise",
    guard: bool = False,
    monitor_every: int | None = None,
    margin_bits: float = 4.0,
    callback: Callable | None = None,
    backward: bool = True,
):
    """A context manager watching ``model`` (``torch.nn.Module`` or ``paddle.nn.Layer``) for NaN/Inf.

    ``on_nonfinite``: ``"raise"`` (:class:`ampsafe.NonFiniteError` at the origin: ``.phase``, ``.module``,
    ``.op``, ``.kind``, ``.sample``, ``.stats``) or ``"record"`` (appended to ``.events``; the pass goes on).
    ``guard``: check only the loss and gradient norms in ``w.check(loss, replay=...)``; on a hit, restore the
    RNG and buffers (BatchNorm statistics) of that step and replay it with full hooks to find the origin.
    ``monitor_every``: headroom monitor period in forward passes; ``margin_bits``: warn below this headroom.
    ``callback(event)``: called with each NonFiniteError and headroom warning. ``backward=False`` skips the
    backward checks (with a dynamic loss scale, a float16 gradient overflow is expected now and then).
    """
    backend = backend_of(model)  # first: resolving it teaches ``unwrap`` its framework's wrappers
    inner = unwrap(model)
    return backend.watch(
        inner,
        on_nonfinite=on_nonfinite,
        guard=guard,
        monitor_every=monitor_every,
        margin_bits=margin_bits,
        callback=callback,
        backward=backward,
        scan=scan,  # the monitor's paths; passed in so that core never imports the front end
    )
