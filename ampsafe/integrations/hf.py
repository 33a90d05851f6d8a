"""``amp/*`` metrics in HF ``Trainer``'s logs, so every ``report_to`` logger (TensorBoard, W&B, MLflow, ...) gets them.

Example::

    from ampsafe.integrations.hf import AmpCallback
    trainer = Trainer(model, args, callbacks=[AmpCallback()])   # TrainingArguments(fp16=True, report_to=...)

Why it moves itself: ``Trainer`` puts the callbacks a user passes *after* its own reporting callbacks
(``TensorBoardCallback``, ``WandbCallback``, ...), and they write ``logs`` in their ``on_log`` as they get it,
so keys a user callback adds in its ``on_log`` reach no logger. HF hands a callback neither its trainer nor
its ``CallbackHandler``; but the handler is the caller of ``on_init_end`` (and ``on_train_begin``), so there
the callback finds the handler's list holding it and moves itself just ahead of the first reporting callback.
The console line (``ProgressCallback``) stays as it was. Where that lookup finds nothing (another
``transformers`` than the one this was read against), a warning says so and :func:`add_callback` places it.

HF's logging callbacks prefix training keys with ``train/``: TensorBoard shows ``train/amp/loss_scale``. The
scaler is the one the Trainer steps with: accelerate's, reached through the optimizer the callback is handed
(``AcceleratedOptimizer.scaler``), or the ``scaler`` given to the callback. A run without loss scaling logs
nothing. ``trainer.state.log_history`` gets the keys too.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Optional

from .metrics import amp_metrics

__all__ = ["AmpCallback", "add_callback"]  # noqa: F822 - AmpCallback is built on first use (__getattr__)


def __getattr__(name: str):
    if name == "AmpCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_callback(trainer: Any, scaler: Any = None):
    """Add an :class:`AmpCallback` to a built ``trainer``, ahead of its reporting callbacks; returns it."""
    callback = _callback_class()(scaler=scaler)
    _go_ahead(trainer.callback_handler.callbacks, callback, append=True)
    return callback


def _reporting_classes() -> tuple[type, ...]:
    """The callback classes ``report_to`` adds (``TensorBoardCallback``, ``WandbCallback``, ...)."""
    from transformers.integrations import integration_utils

    return tuple(set(integration_utils.INTEGRATION_TO_CALLBACK.values()))


def _go_ahead(callbacks: list, callback: Any, append: bool = False) -> None:
    """Move ``callback`` in ``callbacks`` just ahead of the first reporting callback (or leave it where it is
    when none comes before it; ``append``: add it first). Only entries ahead of its old place shift, so a
    ``call_event`` looping over ``callbacks`` while this runs calls every callback once."""
    reporting = _reporting_classes()
    first = next((i for i, cb in enumerate(callbacks) if isinstance(cb, reporting)), None)
    mine = next((i for i, cb in enumerate(callbacks) if cb is callback), None)
    if mine is None:
        callbacks.insert(len(callbacks) if first is None else first, callback)
    elif first is not None and first < mine:
        del callbacks[mine]
        callbacks.insert(first, callback)


def _callbacks_calling(callback: Any, frame) -> Optional[list]:
    """The callback list of the ``CallbackHandler`` whose ``call_event`` is running ``callback``'s event: the
    ``self`` of a calling frame whose ``callbacks`` list holds this very callback."""
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        callbacks = getattr(owner, "callbacks", None)
        if isinstance(callbacks, list) and any(cb is callback for cb in callbacks):
            return callbacks
        frame = frame.f_back
    return None


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    class AmpCallback(TrainerCallback):
        """Adds ``amp/loss_scale``, ``amp/overflow_steps``, ``amp/skipped_steps``, ``amp/heals`` and
        ``amp/floor_hits`` (:mod:`ampsafe.integrations.metrics`) to every ``logs`` of the ``Trainer``, ahead of
        its reporting callbacks. ``scaler``: the scaler to read (default: the Trainer's, through accelerate)."""

        def __init__(self, scaler: Any = None) -> None:
            self.scaler = scaler
            self._placed = False

        def on_init_end(self, args, state, control, **kwargs):
            self._place(sys._getframe(1))

        def on_train_begin(self, args, state, control, **kwargs):
            self._place(sys._getframe(1))

        def on_log(self, args, state, control, logs=None, optimizer=None, **kwargs):
            scaler = self.scaler if self.scaler is not None else getattr(optimizer, "scaler", None)
            metrics = amp_metrics(scaler)
            if logs is None or not metrics:
                return
            mirrored = _history_entry(state, logs)
            logs.update(metrics)
            if mirrored is not None:
                mirrored.update(metrics)

        def _place(self, frame) -> None:
            if self._placed:
                return
            callbacks = _callbacks_calling(self, frame)
            self._placed = True
            if callbacks is None:
                warnings.warn(
                    "ampsafe AmpCallback could not find the Trainer's callback list to go ahead of its reporting "
                    "callbacks: the amp/* keys may not reach TensorBoard or W&B. Add it with "
                    "ampsafe.integrations.hf.add_callback(trainer) instead.",
                    stacklevel=2,
                )
                return
            _go_ahead(callbacks, self)

    AmpCallback.__module__ = __name__
    AmpCallback.__qualname__ = "AmpCallback"
    return AmpCallback


def _history_entry(state: Any, logs: dict) -> Optional[dict]:
    """The ``state.log_history`` entry ``Trainer.log`` made from ``logs`` just before ``on_log`` (a copy plus
    ``step``), so the history keeps what the loggers get; None when the last entry is not that copy."""
    history = getattr(state, "log_history", None)
    if not history or not isinstance(history[-1], dict):
        return None
    last = history[-1]
    # a shallow copy holds the very value objects (a NaN loss is not == itself)
    same = last.get("step") == state.global_step and all(last.get(k) is v or last.get(k) == v for k, v in logs.items())
    return last if same else None
