"""mmengine: the ``amp/*`` hook, adding it under ``ampsafe run``, and ``--emulate-fp16`` for ``AmpOptimWrapper``.

**The hook**: ``amp/*`` metrics through mmengine's ``MessageHub``, so its ``LoggerHook`` writes them to every
visualizer backend (the local ``scalars.json``, TensorBoard, W&B, MLflow) with the training log line.
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
imports mmengine itself. Under ``ampsafe run`` one is registered on the ``Runner`` once it is built (unless the
config added one).

**--emulate-fp16** (``optim_wrapper=dict(type="AmpOptimWrapper", ...)``, and so mmdet / mmpretrain configs with
``--amp``) on a CPU: ``AmpOptimWrapper.__init__`` asserts a GPU (``is_cuda_available() or is_npu_available() or
...``), and its ``optim_context`` enters ``mmengine.runner.amp.autocast`` for the runner's device, which on a CPU
is bfloat16 autocast with CPU's op lists. For a float16 wrapper on a CPU this lets the constructor past that one
assertion (the runner's device stays the CPU: nothing else is told CUDA exists) and makes its ``optim_context``
enter ``torch.autocast("cuda", float16)`` (the emulation: CPU float16 with CUDA's op lists). Its scaler is the
``torch.cuda.amp.GradScaler`` that ``ampsafe run`` has made ampsafe's, scaling on the CPU. A ``bfloat16``
wrapper and ``use_fsdp`` are left as mmengine decides.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any

from ..integrations.metrics import LOSS_SCALE, amp_metrics
from . import Host, emulating
from ._install import after_init

__all__ = ["AmpSafeHook", "register", "scaler_of", "emulate", "HOST"]  # noqa: F822 - AmpSafeHook: built on first use

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


# -- under ampsafe run: the hook registered on the Runner once it is built
def _add_to_runner(session, module) -> None:
    def add(runner):
        kind = register()
        if any(isinstance(hook, kind) for hook in runner.hooks):
            return None
        runner.register_hook(kind())
        return "AmpSafeHook"

    after_init(session, module.Runner, add, "mmengine Runner")


# -- --emulate-fp16
_PATCHED = {
    "mmengine.optim.optimizer.amp_optimizer_wrapper": (
        "AmpOptimWrapper.__init__",
        "AmpOptimWrapper.optim_context",
        "OptimWrapper.optim_context",
        "is_cuda_available",
    )
}


def _float16(dtype) -> bool:
    import torch

    return dtype is None or dtype in ("float16", torch.float16)


def emulate(module, set_attr, tell) -> str:
    import torch

    Amp = module.AmpOptimWrapper
    original_init = Amp.__init__
    original_context = Amp.optim_context
    base_context = module.OptimWrapper.optim_context

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        emulated = emulating() and not kwargs.get("use_fsdp") and _float16(kwargs.get("dtype"))
        if not emulated or module.is_cuda_available():
            original_init(self, *args, **kwargs)
            self._ampsafe_emulated = False
            return
        check = module.is_cuda_available
        module.is_cuda_available = lambda: True  # this constructor's GPU assertion only
        try:
            original_init(self, *args, **kwargs)
        finally:
            module.is_cuda_available = check
        self._ampsafe_emulated = True
        tell(
            "--emulate-fp16 [mmengine]: AmpOptimWrapper on a CPU takes its CUDA float16 path: autocast('cuda'), "
            f"loss scaler {type(self.loss_scaler).__name__}('cuda') on the CPU"
        )

    @functools.wraps(original_context)
    @contextlib.contextmanager
    def optim_context(self, model):
        if not getattr(self, "_ampsafe_emulated", False):
            with original_context(self, model):
                yield
            return
        with base_context(self, model), torch.autocast("cuda", dtype=torch.float16):
            yield

    set_attr(Amp, "__init__", __init__)
    set_attr(Amp, "optim_context", optim_context)
    return "--emulate-fp16: mmengine AmpOptimWrapper on a CPU will take the CUDA float16 path (integration ready)"


HOST = Host(
    "mmengine",
    loggers={"mmengine.runner.runner": _add_to_runner},
    emulation=_PATCHED,
    emulate=emulate,
)


if "mmengine" in sys.modules:  # imported by a config's custom_imports, or after mmengine: usable by name at once
    register()
