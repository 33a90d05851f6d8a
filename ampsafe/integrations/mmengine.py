"""``amp/*`` metrics through mmengine's ``MessageHub``, so its ``LoggerHook`` writes them to every visualizer
backend (the local ``scalars.json``, TensorBoard, W&B, MLflow) with the training log line.

Example (a config)::

    custom_imports = dict(imports=["ampsafe.integrations.mmengine"], allow_failed_imports=False)
    custom_hooks = [dict(type="AmpSafeHook")]
    optim_wrapper = dict(type="AmpOptimWrapper", optimizer=...)

After every training iteration the hook puts :func:`ampsafe.integrations.metrics.amp_metrics` of the optimizer
wrapper's scaler (``runner.optim_wrapper.loss_scaler``, or the ``scaler`` given) in the hub as ``train/amp/...``;
it runs before ``LoggerHook`` (priority ``NORMAL`` against ``BELOW_NORMAL``). ``LogProcessor`` averages every key
matching ``loss`` over its window, which for ``amp/loss_scale`` would log a mean of past scales: the hook asks
``log_processor.custom_cfg`` for the current value instead (what a config would write there by hand). A run
without a loss scaler logs nothing.

``AmpSafeHook`` is registered in mmengine's ``HOOKS`` under that name when this module is imported in a process
that has imported mmengine (as ``custom_imports`` does), or by :func:`register`; importing this module never
imports mmengine itself.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .metrics import LOSS_SCALE, amp_metrics

__all__ = ["AmpSafeHook", "register", "scaler_of"]  # noqa: F822 - AmpSafeHook is built on first use (__getattr__)

NAME = "AmpSafeHook"


def __getattr__(name: str):
    if name == NAME:
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> type:
    """Register ``AmpSafeHook`` in mmengine's ``HOOKS`` registry (idempotent); returns the class."""
    from mmengine.registry import HOOKS

    hook = _hook_class()
    if HOOKS.module_dict.get(NAME) is not hook:
        HOOKS.register_module(name=NAME, module=hook, force=True)
    return hook


def scaler_of(runner: Any) -> Any:
    """The loss scaler of the runner's optimizer wrapper (``AmpOptimWrapper.loss_scaler``), or None."""
    return getattr(getattr(runner, "optim_wrapper", None), "loss_scaler", None)


@functools.cache
def _hook_class() -> type:
    from mmengine.hooks import Hook

    class AmpSafeHook(Hook):
        """Puts ``amp/loss_scale``, ``amp/overflow_steps``, ``amp/skipped_steps``, ``amp/heals`` and
        ``amp/floor_hits`` in the runner's ``MessageHub`` after every training iteration. ``scaler``: the scaler
        to read (default: the optimizer wrapper's ``loss_scaler``)."""

        priority = "NORMAL"

        def __init__(self, scaler: Any = None) -> None:
            self.scaler = scaler

        def before_train(self, runner) -> None:
            custom = getattr(getattr(runner, "log_processor", None), "custom_cfg", None)
            source = LOSS_SCALE
            if isinstance(custom, list) and not any(
                cfg.get("log_name", cfg.get("data_src")) == source for cfg in custom
            ):
                custom.append(dict(data_src=source, method_name="current"))

        def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
            scaler = self.scaler if self.scaler is not None else scaler_of(runner)
            for name, value in amp_metrics(scaler).items():
                runner.message_hub.update_scalar(f"train/{name}", value)

    AmpSafeHook.__module__ = __name__
    AmpSafeHook.__qualname__ = NAME
    return AmpSafeHook


if "mmengine" in sys.modules:  # imported by a config's custom_imports, or after mmengine: usable by name at once
    register()
