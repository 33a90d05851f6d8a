"""The floor's measured verdict: replay the last batch once under the sentinel and say which pass overflowed.

Why: a scaler at its floor used to guess the pass from the loss ("the loss was finite, so the overflow is in the
backward pass"), which is wrong whenever the loss hides non-finite activations (DBNet's OHEM and masks). Here
the captured inputs of the model's last forward are checked (the data), then replayed under ``ampsafe.watch``
in the step's own precision (the forward: module, op, and the float32 magnitude of that module's output), and
otherwise the gradients the step really had name the backward. Model state (buffers, normalization
statistics) is put back after each replay (:meth:`Backend.snapshot`). Framework-neutral: the precision of the
replay comes from the scaler (``replay_context``), everything else from the model's Backend. The result is a
:class:`~ampsafe.core.verdict.HealVerdict`; when a heal follows, its scan supplies the float32 magnitude
(``magnitude=False`` here), so the batch runs once under the sentinel and once in the scan.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Optional

import numpy as np

from ..core.backend import FLOAT32
from ..core.verdict import MAX_NAMED, HealVerdict
from .evidence import nonfinite_sample

__all__ = ["HealVerdict", "measure", "not_replayed", "anywhere", "MAX_NAMED"]


def anywhere(backend, model, flag: bool) -> bool:
    """Whether ``flag`` holds on any rank, where every forward of ``model`` is collective (FSDP2's all-gathers):
    there a rank may run a forward only when all ranks run it, so a branch that leads to one is taken by all ranks
    or by none (else the ranks wait on different collectives: a hang, or gloo's "collective mismatch"). Elsewhere
    this rank's own ``flag``. Every rank must call it at the same point, as any collective."""
    if not backend.sharding.forward_is_collective(model):
        return flag
    return any(backend.all_gather(bool(flag)))


def not_replayed(reason: str) -> HealVerdict:
    """The verdict when there was nothing to replay (``reason``: why)."""
    return HealVerdict("not replayed", reason=reason)


@contextmanager
def _quiet(name: str):
    """The watch logs each origin it records; the floor error carries it instead."""
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


def _run(model, latest) -> Any:
    """The captured forward again: ``model(*args, **kwargs)``."""
    args, kwargs = latest
    return model(*args, **kwargs)


def _float32_amax(backend, model, path: str, latest) -> Optional[float]:
    """max |output| of the module at ``path`` when the captured forward runs in float32 (state put back)."""
    module = backend.modules(model).get(path)
    if module is None and not backend.sharding.forward_is_collective(model):
        return None  # (a collective forward runs all the same: the other ranks run theirs)
    seen: list[float] = []

    def keep(output) -> None:
        for t in backend.tensors.leaves(output):
            a = backend.tensors.to_numpy(t)
            if a is not None and a.size:
                seen.append(float(np.nanmax(np.abs(a))))

    handle = backend.forward_hook(module, keep) if module is not None else None
    try:
        with backend.replay(model, FLOAT32):
            _run(model, latest)
    except Exception:  # noqa: BLE001 - the magnitude is extra evidence, the verdict stands without it
        return None
    finally:
        if handle is not None:
            handle.remove()
    return max(seen) if seen else None


def _forward_event(backend, model, latest, replay_context: Callable[[], Any]):
    """(the first forward NonFiniteError the sentinel records on one replay, or None; the first origin whose
    non-finite values the forward dropped, or None). Model state and random state are put back."""
    with backend.replay(model), _quiet("ampsafe.watch"), replay_context():
        with backend.watch(model, on_nonfinite="record", backward=False) as watch:
            _run(model, latest)
    event = next((e for e in watch.events if getattr(e, "phase", "") == "forward"), None)
    return event, next(iter(getattr(watch, "deferred", ())), None)


def measure(
    backend,
    model,
    latest,
    *,
    replay_context: Optional[Callable[[], Any]] = None,
    offenders: tuple = (),
    loss_finite: Optional[bool] = None,
    model_label: str = "",
    magnitude: bool = True,
) -> HealVerdict:
    """Replay the batch of ``latest`` (``InputCapture.latest``) and return what was measured.

    ``replay_context()``: the step's precision (autocast / float16 emulation, no grad); ``offenders``: names of
    the parameters whose gradients the step found non-finite, from the loss backwards; ``loss_finite``: whether
    the losses ``scale()`` saw were finite (None: not seen). ``magnitude=False``: leave the float32 magnitude of
    a forward verdict's module to the heal that follows (its scan runs the batch in float32 anyway).
    """
    label = model_label or type(model).__name__
    if latest is None:
        return not_replayed(
            f"no inputs of the resolved model ({label}) were captured since the last update(), so "
            "which pass overflowed was not measured (a custom loop whose forward does not call that module; "
            "pass model= to the scaler to name the module the loop runs)"
        )
    bad = nonfinite_sample(latest, backend)
    if anywhere(backend, model, bad is not None):  # another rank's bad batch: no rank replays (a collective forward)
        return HealVerdict("data", input=bad[0], sample=bad[1]) if bad is not None else HealVerdict("none")
    event, dropped = _forward_event(backend, model, latest, replay_context or nullcontext)
    if event is None and offenders and loss_finite is not False:
        # the forward made non-finite values and dropped them (DBHead's reciprocal(1 + exp(x)) is 0 where exp
        # overflowed), and the step's gradients are non-finite: the backward runs through those lanes
        event = dropped
    amax = None
    if anywhere(backend, model, event is not None and magnitude):
        # a rank without an event joins the forward (its module: none, so nothing hooked)
        amax = _float32_amax(backend, model, event.module if event is not None else "\0", latest)
    if event is not None:
        return HealVerdict(
            "forward", module=event.module, op=event.op, kind=event.kind, amax_fp32=amax, sample=event.sample
        )
    if loss_finite is False:
        return HealVerdict("loss")
    if offenders:
        return HealVerdict("backward", params=tuple(offenders))
    return HealVerdict("none")
