"""``amp/*`` metrics through Lightning's own logging (``pl_module.log``), so every Lightning logger gets them.

Example::

    from ampsafe.integrations.lightning import AmpMetricsCallback
    trainer = lightning.pytorch.Trainer(precision="16-mixed", callbacks=[AmpMetricsCallback()])

After every training batch the callback logs :func:`ampsafe.integrations.metrics.amp_metrics` of the precision
plugin's scaler (``trainer.precision_plugin.scaler``, or the ``scaler`` given), per step, not reduced over the
epoch: the values are counters and a scale, already the state after the step. The logger writes them at its
own cadence (``Trainer(log_every_n_steps=...)``). A run without a scaler (``bf16-mixed``, 32-bit) logs nothing.
Works with ``lightning.pytorch`` and the older ``pytorch_lightning`` package alike.
"""

from __future__ import annotations

import functools
from typing import Any

from .metrics import amp_metrics

__all__ = ["AmpMetricsCallback", "callback_class", "scaler_of"]  # noqa: F822 - AmpMetricsCallback is built on first use (__getattr__)


def __getattr__(name: str):
    if name == "AmpMetricsCallback":
        return _callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def callback_class(package: str = "lightning.pytorch") -> type:
    """The callback class built on ``package``'s ``Callback`` (``"pytorch_lightning"`` for the older package)."""
    return _callback_class(package)


def scaler_of(trainer: Any) -> Any:
    """The scaler the Lightning ``trainer`` steps with: its precision plugin's, or None."""
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None)


@functools.cache
def _callback_class(package: str) -> type:
    import importlib

    Callback = importlib.import_module(package).Callback

    class AmpMetricsCallback(Callback):
        """Logs ``amp/loss_scale``, ``amp/overflow_steps``, ``amp/skipped_steps``, ``amp/heals`` and
        ``amp/floor_hits`` after every training batch. ``scaler``: the scaler to read (default: the precision
        plugin's)."""

        def __init__(self, scaler: Any = None) -> None:
            self.scaler = scaler

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            metrics = amp_metrics(self.scaler if self.scaler is not None else scaler_of(trainer))
            if metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    AmpMetricsCallback.__module__ = __name__
    AmpMetricsCallback.__qualname__ = "AmpMetricsCallback"
    return AmpMetricsCallback
