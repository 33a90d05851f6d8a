"""--emulate-fp16 for mmengine's ``AmpOptimWrapper`` (``optim_wrapper=dict(type="AmpOptimWrapper", ...)``, and
so mmdet / mmpretrain configs with ``--amp``) on a CPU.

``AmpOptimWrapper.__init__`` asserts a GPU (``is_cuda_available() or is_npu_available() or ...``), and its
``optim_context`` enters ``mmengine.runner.amp.autocast`` for the runner's device, which on a CPU is bfloat16
autocast with CPU's op lists. For a float16 wrapper on a CPU this lets the constructor past that one assertion
(the runner's device stays the CPU: nothing else is told CUDA exists) and makes its ``optim_context`` enter
``torch.autocast("cuda", float16)`` (the emulation: CPU float16 with CUDA's op lists). Its scaler is the
``torch.cuda.amp.GradScaler`` that ``ampsafe run`` has made ampsafe's, scaling on the CPU. A ``bfloat16``
wrapper and ``use_fsdp`` are left as mmengine decides.
"""

from __future__ import annotations

import contextlib
import functools

TARGETS = ("mmengine.optim.optimizer.amp_optimizer_wrapper",)
KNOWN = {
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


def install(module, set_attr, tell) -> str:
    import torch

    from .active import emulating

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
