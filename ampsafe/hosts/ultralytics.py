"""ultralytics: the ``amp/*`` callback, adding it under ``ampsafe run``, and ``--emulate-fp16`` for ``amp=True``.

**The callback**: ``amp/*`` metrics in ultralytics' per-epoch logs: TensorBoard, W&B, MLflow, ClearML, Comet,
DVC and results.csv. Example::

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
logged then, as for any scaler that counts nothing. Under ``ampsafe run`` it goes first in the trainer's
``on_train_epoch_end`` callbacks once the trainer is built (unless the script added it).

**--emulate-fp16** (``model.train(..., amp=True)``) on a CPU: ultralytics' trainer enables AMP only when
``check_amp(model)`` passes, and ``check_amp`` returns False for a model on a CPU; its autocast
(``ultralytics.utils.torch_utils.autocast``) asks for the trainer's device type, "cpu", whose op lists are not
CUDA's. For a float16 run on a CPU (``amp=True``, not ``"bf16"``) this answers ``check_amp`` as a GPU that passed
would, and has the trainer's ``autocast(True, device="cpu")`` enter ``torch.amp.autocast("cuda")`` (the
emulation: CPU float16 with CUDA's op lists). Its ``GradScaler("cuda", enabled=True)`` is then ampsafe's, scaling
on the CPU. Validation during training stays float32, as ultralytics keeps it on a CPU. Only the trainer module's
own names are patched.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..integrations.metrics import amp_metrics
from . import Host, emulating
from ._install import after_init

__all__ = ["add_callbacks", "epoch_end_callback", "emulate", "HOST"]


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


# -- under ampsafe run: the callback put first once the trainer is built
def _add_to_trainer(session, module) -> None:
    def add(trainer):
        callbacks = trainer.callbacks.setdefault("on_train_epoch_end", [])
        if any(getattr(cb, "__module__", None) == __name__ for cb in callbacks):
            return None
        callbacks.insert(0, epoch_end_callback())  # ahead of the logger callbacks the trainer added
        return "on_train_epoch_end callback"

    after_init(session, module.BaseTrainer, add, "ultralytics trainer")


# -- --emulate-fp16
_PATCHED = {"ultralytics.engine.trainer": ("check_amp", "autocast", "BaseTrainer")}


def emulate(module, set_attr, tell) -> str:
    original_check = module.check_amp
    original_autocast = module.autocast

    @functools.wraps(original_check)
    def check_amp(model, *args, **kwargs):
        device = next(iter(model.parameters()), None)
        if emulating() and device is not None and device.device.type == "cpu":
            tell(
                "--emulate-fp16 [ultralytics]: check_amp passes for a model on a CPU and the trainer's autocast "
                "is autocast('cuda'): amp=True trains in float16 with ampsafe's GradScaler('cuda') on the CPU"
            )
            return True
        return original_check(model, *args, **kwargs)

    @functools.wraps(original_autocast)
    def autocast(enabled, device: str = "cuda"):
        if emulating() and device == "cpu" and enabled is True:
            device = "cuda"
        return original_autocast(enabled, device=device)

    set_attr(module, "check_amp", check_amp)
    set_attr(module, "autocast", autocast)
    return "--emulate-fp16: ultralytics amp=True on a CPU will take the CUDA float16 path (integration ready)"


HOST = Host(
    "ultralytics",
    loggers={"ultralytics.engine.trainer": _add_to_trainer},
    emulation=_PATCHED,
    emulate=emulate,
)
