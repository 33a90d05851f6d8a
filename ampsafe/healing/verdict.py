"""The floor's measured verdict: replay the last batch once under the sentinel and say which pass overflowed.

Why: a scaler at its floor used to guess the pass from the loss ("the loss was finite, so the overflow is in the
backward pass"), which is wrong whenever the loss hides non-finite activations (DBNet's OHEM and masks). Here
the captured inputs of the model's last forward are checked (the data), then replayed under ``ampsafe.watch``
in the step's own precision (the forward: module, op, and the float32 magnitude of that module's output), and
otherwise the gradients the step really had name the backward. Model state (buffers, normalization
statistics) is put back after each replay (:meth:`Backend.snapshot`). Framework-neutral: the precision of the
replay comes from the scaler (``replay_context``), everything else from the model's Backend.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..core.graph import FP16_MAX
from .evidence import nonfinite_sample

__all__ = ["Verdict", "measure", "replay_inputs", "MAX_NAMED"]

MAX_NAMED = 8  # parameters named in a backward verdict; the rest are counted


@dataclass(frozen=True)
class Verdict:
    """What the replay measured. ``where``: ``"forward"``, ``"backward"``, ``"data"``, ``"loss"`` (the model's
    forward was finite, the loss ``scale()`` saw was not), ``"none"`` (nothing non-finite reproduced on this
    process) or ``"not replayed"`` (no captured inputs). ``text``: the sentence the floor error carries."""

    where: str
    text: str
    module: Optional[str] = None
    op: Optional[str] = None
    kind: Optional[str] = None
    amax_fp32: Optional[float] = None
    sample: Optional[int] = None
    params: tuple = ()


def replay_inputs(latest) -> Any:
    """``example_inputs`` (as ``_framework.call`` takes them) from an ``InputCapture.latest`` pair."""
    args, kwargs = latest
    return dict(kwargs) if kwargs and not args else tuple(args)


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


def _post_hook(module, fn):
    """A forward post-hook ``fn(output)`` on a torch module or Paddle layer (duck-typed, no framework test)."""
    register = getattr(module, "register_forward_hook", None) or module.register_forward_post_hook
    return register(lambda _m, _inputs, output: fn(output))


def _run(model, latest) -> Any:
    """The captured forward again: ``model(*args, **kwargs)``."""
    args, kwargs = latest
    return model(*args, **kwargs)


def _float32_amax(backend, model, path: str, latest) -> Optional[float]:
    """max |output| of the module at ``path`` when the captured forward runs in float32 (state put back)."""
    module = backend.modules(model).get(path)
    if module is None:
        return None
    seen: list[float] = []

    def keep(output) -> None:
        for t in backend.tensors(output):
            a = backend.to_numpy(t)
            if a is not None and a.size:
                seen.append(float(np.nanmax(np.abs(a))))

    handle = _post_hook(module, keep)
    restore = backend.snapshot(model)
    try:
        with backend.float32():
            _run(model, latest)
    except Exception:  # noqa: BLE001 - the magnitude is extra evidence, the verdict stands without it
        return None
    finally:
        handle.remove()
        restore()
    return max(seen) if seen else None


def _forward_event(backend, model, latest, replay_context: Callable[[], Any]):
    """The first forward NonFiniteError the sentinel records on one replay (state put back), or None."""
    restore = backend.snapshot(model)
    try:
        with _quiet("ampsafe.watch"), replay_context():
            with backend.watch(model, on_nonfinite="record", backward=False) as watch:
                _run(model, latest)
    finally:
        restore()
    return next((e for e in watch.events if getattr(e, "phase", "") == "forward"), None)


def _named(names: list) -> str:
    text = ", ".join(names[:MAX_NAMED])
    if len(names) > MAX_NAMED:
        text += f" and {len(names) - MAX_NAMED} more"
    return text


def measure(
    backend,
    model,
    latest,
    *,
    replay_context: Optional[Callable[[], Any]] = None,
    offenders: tuple = (),
    loss_finite: Optional[bool] = None,
    model_label: str = "",
) -> Verdict:
    """Replay the batch of ``latest`` (``InputCapture.latest``) and return what was measured.

    ``replay_context()``: the step's precision (autocast / float16 emulation, no grad); ``offenders``: names of
    the parameters whose gradients the step found non-finite, from the loss backwards; ``loss_finite``: whether
    the losses ``scale()`` saw were finite (None: not seen).
    """
    label = model_label or type(model).__name__
    if latest is None:
        return Verdict(
            "not replayed",
            f"not replayed: no inputs of the resolved model ({label}) were captured since the last update(), so "
            "which pass overflowed was not measured (a custom loop whose forward does not call that module; "
            "pass model= to the scaler to name the module the loop runs)",
        )
    bad = nonfinite_sample(latest, backend)
    if bad is not None:
        return Verdict(
            "data",
            f"the data: input {bad[0]} of the last batch is non-finite at sample {bad[1]} (before the model ran)",
            sample=bad[1],
        )
    event = _forward_event(backend, model, latest, replay_context or nullcontext)
    if event is not None:
        where = event.module or "<root>"
        amax = _float32_amax(backend, model, event.module, latest)
        if amax is None:
            magnitude = ""
        elif not np.isfinite(amax):
            magnitude = "; it is non-finite in float32 too"
        elif amax > FP16_MAX:
            magnitude = f"; in float32 its output reaches |x| = {amax:.4g} (float16's max is {FP16_MAX:g})"
        else:  # e.g. DBHead's step function: exp overflows, the module's output is a bounded map
            magnitude = (
                f"; in float32 {where}'s output stays within |x| <= {amax:.4g}: the overflow is inside it, at "
                f"its {event.op}"
            )
        sample = f", first in sample {event.sample}" if event.sample is not None else ""
        return Verdict(
            "forward",
            f"the forward pass: the first non-finite value comes from {where}:{event.op} (kind "
            f"{event.kind!r}{sample}){magnitude}",
            module=event.module,
            op=event.op,
            kind=event.kind,
            amax_fp32=amax,
            sample=event.sample,
        )
    if loss_finite is False:
        return Verdict(
            "loss",
            "the loss: the model's forward pass replayed finite, yet the loss passed to scale() was non-finite, so "
            "the overflow is in the loss computation after the model; no loss scale can fix this",
        )
    if offenders:
        return Verdict(
            "backward",
            f"the backward pass: the model's forward pass replayed finite, and the gradients of {len(offenders)} "
            f"parameter{'s' if len(offenders) != 1 else ''} overflowed (from the loss backwards): "
            f"{_named(list(offenders))}",
            params=tuple(offenders),
        )
    return Verdict(
        "none",
        "nothing reproduced on this process: the model's forward pass replayed finite and no gradient the "
        "optimizer holds here was non-finite (they were on another rank, or outside the optimizers)",
    )
