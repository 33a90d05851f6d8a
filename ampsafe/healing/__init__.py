"""Self-healing AMP: at the loss-scale floor, find the paths that overflow, make them FP32 islands, go on.

    scaler = ampsafe.torch.GradScaler(min_scale=1.0, on_floor="heal")   # or ampsafe.paddle.GradScaler:
    ...                                                                  # heals at the floor by itself
    ampsafe.heal(model, scaler=scaler)                                   # or attach one with options
    ...                                                                  # the usual training loop

    ampsafe.heal(model, scaler=scaler, patience=2)                       # or: after 2 overflowing steps in a row
    paths = ampsafe.heal(model, lambda: (images,))                       # custom loops: heal now, on this batch

At a heal the last batch (kept by a forward pre-hook) is looked at once: non-finite inputs -> error naming the
sample; then one ``scan`` of it (its float32 forward also shows whether the output, or the ``loss_fn`` loss, is
finite: if not -> error, a numerical failure) finds the paths within ``margin_bits`` of 65504,
``patch(policy="island", paths=...)`` islands them, running statistics that the overflowing forwards poisoned
are reset, and the scaler restarts from the scale before the collapse.

Why it can work: islands keep parameter identity, so the optimizer and its state go on untouched; only the
overflowing paths pay for float32. Why it gives up: an overflow that is not in the model (non-finite data) or
that float32 has too (a numerical error) is not a precision problem, and more islands would hide it.
Distributed (torch.distributed / paddle.distributed initialized): verdicts are all-gathered, every rank raises
the same error or islands the union of the paths found on any rank.

A bare scaler (no ``ampsafe.heal`` call) resolves its model at its first step (``Backend.owner_of``), keeps
the inputs of its latest forward, and heals through the same :class:`Healer`; before any floor heal or error it
replays the batch once under the sentinel and reports the pass it measured (forward: module, op, float32
magnitude; backward: the parameters; data: the sample), as one :class:`~ampsafe.core.verdict.HealVerdict` that
the floor error, the heal and its log line read.

Inside: :mod:`~ampsafe.healing.evidence` (what the batch shows), :mod:`~ampsafe.healing.healer` (the
decision), :mod:`~ampsafe.healing.attach` (``heal``: to a scaler, or now), :mod:`~ampsafe.healing.floor_replay` (the
floor's measured verdict), :mod:`~ampsafe.healing.scaler` (what the GradScalers inherit: model resolution,
capture, built-in heal, ``patience``), :mod:`~ampsafe.healing.fronts` (``scan`` and ``patch``, handed down by
the package ``ampsafe``: this layer never imports the front). All of it goes through the model's
:class:`~ampsafe.core.backend.Backend`. The names below load on first use, so wiring the fronts stays light.
"""

from __future__ import annotations

from .._lazy import lazy_attributes

__all__ = ["heal", "Healer", "nonfinite_sample", "restore_scale"]

_LAZY = {
    "heal": ".attach",
    "Healer": ".healer",
    "nonfinite_sample": ".evidence",
    "restore_scale": ".evidence",
}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
