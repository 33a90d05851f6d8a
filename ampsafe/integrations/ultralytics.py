"""``amp/*`` metrics in ultralytics' per-epoch logs: TensorBoard, W&B, MLflow, ClearML, Comet, DVC and results.csv.

Example::

    from ultralytics import YOLO
    from ampsafe.integrations.ultralytics import add_callbacks
    model = YOLO("yolov8n.yaml")
    add_callbacks(model)
    model.train(data=..., amp=True)

ultralytics' loggers log once per epoch, and every one of them (and ``results.csv``) reads the trainer's ``lr``
dict, which the trainer fills "for loggers" just before ``on_train_epoch_end``. So at ``on_train_epoch_end``
this adds :func:`ampsafe.integrations.metrics.amp_metrics` of the trainer's scaler (``trainer.scaler``, or the
``scaler`` given) to that dict. A callback added to the model runs before the logger callbacks, which the
trainer adds after the model's own. A run without AMP has a disabled scaler: only ``amp/loss_scale`` (1.0) is
logged then, as for any scaler that counts nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from .metrics import amp_metrics

__all__ = ["add_callbacks", "epoch_end_callback"]


def epoch_end_callback(scaler: Any = None) -> Callable[[Any], None]:
    """An ``on_train_epoch_end`` callback that adds the ``amp/*`` metrics to ``trainer.lr`` (the loggers' dict)."""

    def on_train_epoch_end(trainer) -> None:
        metrics = amp_metrics(scaler if scaler is not None else getattr(trainer, "scaler", None))
        if metrics and isinstance(getattr(trainer, "lr", None), dict):
            trainer.lr.update(metrics)

    return on_train_epoch_end


def add_callbacks(model: Any, scaler: Any = None) -> None:
    """Add the ``amp/*`` callback to an ultralytics ``model`` (``YOLO``) or trainer (``add_callback``)."""
    model.add_callback("on_train_epoch_end", epoch_end_callback(scaler))
