"""accelerate: ``--emulate-fp16`` for accelerate and HF ``Trainer`` (``mixed_precision="fp16"`` / ``fp16=True``)
on a CPU. Its ``amp/*`` metrics are the script's own loop's (``--tensorboard``) or HF ``Trainer``'s callback
(:mod:`ampsafe.hosts.hf`).

``Accelerator.__init__`` sets ``native_amp = True`` and builds its ``GradScaler`` only when the device is not
a CPU, so on a CPU ``fp16=True`` trains in float32 without a word. After the constructor, for an fp16
accelerator on a CPU (no DeepSpeed / Megatron / FSDP, which bring their own precision), this sets what the GPU
branch sets: ``native_amp = True`` and ``scaler = torch.amp.GradScaler("cuda", **scaler kwargs)``, which
``ampsafe run`` has made ampsafe's scaler on the CPU. Its autocast (``get_mixed_precision_context_manager``,
used by ``prepare_model`` and ``Accelerator.autocast``) asks for the accelerator's device type, "cpu", whose
op lists are not CUDA's: for such an accelerator it returns ``torch.autocast("cuda", dtype=float16)``, which
the emulation runs on the CPU with CUDA's lists. HF ``Trainer`` builds its ``Accelerator`` from
``TrainingArguments(fp16=True)``, so it takes the same path.
"""

from __future__ import annotations

import functools

from . import Host, emulating

__all__ = ["emulate", "HOST"]


def _emulated(state) -> bool:
    distributed = str(getattr(state, "distributed_type", "NO"))
    return (
        emulating()
        and getattr(state, "mixed_precision", None) == "fp16"
        and getattr(getattr(state, "device", None), "type", None) == "cpu"
        and not any(kind in distributed for kind in ("DEEPSPEED", "MEGATRON", "FSDP", "XLA"))
    )


class _CudaAutocast:
    """``torch.autocast("cuda", float16)`` (emulated on the CPU) as accelerate uses it: a context, or a decorator
    of the model's ``forward`` (``prepare_model``). Inside ampsafe's float32 replays (``TorchBackend.float32``)
    it stays off: a forward that enters autocast by itself would otherwise replay in float16."""

    def __init__(self, kwargs: dict) -> None:
        self._kwargs = kwargs
        self._open: list = []

    def __enter__(self):
        import contextlib

        import torch

        from ..torch.backend import in_float32

        ctx = contextlib.nullcontext() if in_float32() else torch.autocast("cuda", dtype=torch.float16, **self._kwargs)
        self._open.append(ctx)
        return ctx.__enter__()

    def __exit__(self, *exc):
        return self._open.pop().__exit__(*exc)

    def __call__(self, fn):
        @functools.wraps(fn)
        def autocast_forward(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return autocast_forward


def emulate(module, set_attr, tell) -> str:
    import torch

    Accelerator = module.Accelerator
    original_init = Accelerator.__init__
    original_context = module.get_mixed_precision_context_manager

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if getattr(self, "scaler", None) is None and _emulated(self.state):
            handler = getattr(self, "scaler_handler", None)
            self.native_amp = True
            self.scaler = torch.amp.GradScaler("cuda", **(handler.to_kwargs() if handler is not None else {}))
            tell(
                "--emulate-fp16 [accelerate]: Accelerator(mixed_precision='fp16') on a CPU takes its CUDA float16 "
                f"path: native_amp=True, autocast('cuda'), scaler {type(self.scaler).__name__}('cuda') on the CPU"
            )

    @functools.wraps(original_context)
    def get_mixed_precision_context_manager(native_amp=False, autocast_kwargs=None):
        state = module.AcceleratorState()
        if native_amp and _emulated(state):
            return _CudaAutocast(autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {})
        return original_context(native_amp, autocast_kwargs)

    set_attr(Accelerator, "__init__", __init__)
    set_attr(module, "get_mixed_precision_context_manager", get_mixed_precision_context_manager)
    return "--emulate-fp16: accelerate / HF Trainer fp16 on a CPU will take the CUDA float16 path (integration ready)"


HOST = Host(
    "accelerate",
    emulation={
        "accelerate.accelerator": ("Accelerator.__init__", "get_mixed_precision_context_manager", "AcceleratorState")
    },
    emulate=emulate,
)
