"""Lightning (``lightning.pytorch`` and the older ``pytorch_lightning``, and Fabric): the ``amp/*`` callback,
adding it under ``ampsafe run``, and ``--emulate-fp16`` for ``precision="16-mixed"`` on a CPU.

**The callback**: ``amp/*`` metrics through Lightning's own logging (``pl_module.log``), so every Lightning
logger gets them. Example::

    from ampsafe.integrations.lightning import AmpMetricsCallback
    trainer = lightning.pytorch.Trainer(precision="16-mixed", callbacks=[AmpMetricsCallback()])

After every training batch the callback logs :func:`ampsafe.integrations.metrics.amp_metrics` of the precision
plugin's scaler (``trainer.precision_plugin.scaler``, or the ``scaler`` given), per step, not reduced over the
epoch: the values are counters and a scale, already the state after the step. The logger writes them at its
own cadence (``Trainer(log_every_n_steps=...)``). A run without a scaler (``bf16-mixed``, 32-bit) logs nothing.
Works with ``lightning.pytorch`` and the older ``pytorch_lightning`` package alike. Under ``ampsafe run`` it is
appended to ``trainer.callbacks`` once the ``Trainer`` is built (when it has a logger, and the script added none).

**--emulate-fp16**: Lightning's accelerator connector rewrites ``16-mixed`` on a CPU to ``bf16-mixed`` (with a
warning) and builds ``MixedPrecision(precision, "cpu")``. For a ``16-mixed`` run on a CPU accelerator, this lets
the connector choose as it would on a GPU: ``MixedPrecision("16-mixed", "cuda")``, whose autocast is
``torch.autocast("cuda", float16)`` (the emulation: CPU float16 with CUDA's op lists) and whose scaler is
``torch.amp.GradScaler("cuda")`` (ampsafe's, scaling on the CPU). The accelerator, and so every tensor, stays on
the CPU: only the precision plugin's device string is "cuda". Strategies with their own precision (DeepSpeed,
FSDP, XLA) are untouched.
"""

from __future__ import annotations

import functools
from typing import Any

from ..integrations.metrics import amp_metrics
from . import Host, emulating
from ._install import after_init

__all__ = [  # noqa: F822 - AmpMetricsCallback is built on first use (__getattr__)
    "AmpMetricsCallback",
    "callback_class",
    "scaler_of",
    "emulate",
    "HOST",
]


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


# -- under ampsafe run: the callback appended once the Trainer is built
def _add_to_trainer(session, module) -> None:
    package = module.__name__.split(".trainer.")[0]

    def add(trainer):
        kind = callback_class(package)
        if not trainer.loggers or any(isinstance(cb, kind) for cb in trainer.callbacks):
            return None
        trainer.callbacks.append(kind())
        return "AmpMetricsCallback"

    after_init(session, module.Trainer, add, "Lightning Trainer")


# -- --emulate-fp16
_METHOD = "_AcceleratorConnector._check_and_init_precision"
_FABRIC = "_Connector._check_and_init_precision"
_PATCHED = {
    "lightning.pytorch.trainer.connectors.accelerator_connector": (_METHOD,),
    "pytorch_lightning.trainer.connectors.accelerator_connector": (_METHOD,),
    "lightning.fabric.connector": (_FABRIC,),
    "lightning_fabric.connector": (_FABRIC,),
}


def emulate(module, set_attr, tell) -> str:
    fabric = hasattr(module, "_Connector")
    cls = module._Connector if fabric else module._AcceleratorConnector
    flag = "_precision_input" if fabric else "_precision_flag"
    original = cls._check_and_init_precision

    @functools.wraps(original)
    def _check_and_init_precision(self):
        accelerator = self._accelerator_flag
        cpu = accelerator == "cpu" or type(accelerator).__name__ == "CPUAccelerator"
        if not (emulating() and getattr(self, flag, None) == "16-mixed" and cpu):
            return original(self)
        self._accelerator_flag = "cuda"  # what the connector decides from; the accelerator itself stays the CPU's
        try:
            plugin = original(self)
        finally:
            self._accelerator_flag = accelerator
        if getattr(plugin, "device", None) == "cuda" and getattr(plugin, "precision", None) == "16-mixed":
            scaler = getattr(plugin, "scaler", None)
            tell(
                f"--emulate-fp16 [lightning]: {'Fabric' if fabric else 'Trainer'}(precision='16-mixed') on a CPU "
                f"takes its CUDA float16 path: MixedPrecision('16-mixed', 'cuda'), scaler "
                f"{type(scaler).__name__}('cuda') on the CPU, tensors on the CPU"
            )
        return plugin

    set_attr(cls, "_check_and_init_precision", _check_and_init_precision)
    return f"--emulate-fp16: Lightning {'Fabric' if fabric else 'Trainer'} 16-mixed on a CPU will take the CUDA float16 path (integration ready)"


HOST = Host(
    "lightning",
    loggers={
        "lightning.pytorch.trainer.trainer": _add_to_trainer,
        "pytorch_lightning.trainer.trainer": _add_to_trainer,
    },
    emulation=_PATCHED,
    emulate=emulate,
)
