"""PyTorch's :class:`~ampsafe.core.backend.Backend`: the framework facts scan, patch, watch and heal use."""

from __future__ import annotations

import contextlib
import random
import threading

import torch
from torch import nn

from ..core import backend as core
from . import WRAPPERS
from .fsdp import Fsdp2
from .ops import runs_in_fp16
from .tensors import LOW_DTYPES, TENSORS

__all__ = ["TorchBackend", "TorchAmp", "BACKEND", "LOW_DTYPES", "in_float32"]

_float32 = threading.local()  # .depth: inside TorchAmp.float32() (a float32 replay or reference)


def in_float32() -> bool:
    """Inside :meth:`TorchAmp.float32` on this thread: an autocast a model enters by itself (accelerate wraps
    ``forward`` in one) should stay off, so the replay really is float32 (``ampsafe.hosts.accelerate``)."""
    return getattr(_float32, "depth", 0) > 0


class TorchAmp(core.AmpBase):
    """``torch.autocast``: which ops it runs in float16 is :mod:`ampsafe.torch.ops`' lists, per target."""

    low_dtypes = LOW_DTYPES
    in_float32 = staticmethod(in_float32)  # one island line fits every level: autocast never casts parameters

    @staticmethod
    @contextlib.contextmanager
    def float32():
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            _float32.depth = getattr(_float32, "depth", 0) + 1
            stack.callback(lambda: setattr(_float32, "depth", _float32.depth - 1))
            yield

    @staticmethod
    def runs_low(op, kind, input_halves, *, level, target) -> bool:
        return runs_in_fp16(op, kind, input_halves, target=target, level=level)

    @staticmethod
    def state() -> tuple:
        """(device, enabled, dtype) of CPU and CUDA autocast now."""
        return (
            ("cpu", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
            ("cuda", torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")),
        )

    @staticmethod
    def replay(state) -> contextlib.ExitStack:
        """The autocast the captured forward ran under, no grad."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        for device, enabled, dtype in state or ():
            if enabled:
                stack.enter_context(torch.autocast(device, dtype=dtype))
        return stack

    @staticmethod
    def heal_options(state) -> dict:
        """The target whose autocast lists the step ran under: CPU autocast, else CUDA's."""
        on_cpu = any(device == "cpu" and enabled for device, enabled, _ in state or ())
        return {"target": "cpu" if on_cpu else "cuda"}


class TorchBackend(core.BackendBase):
    """``torch.nn.Module`` models. Normalization statistics are buffers (``running_mean``/``running_var``)."""

    module_type = nn.Module
    sharding = Fsdp2()
    wrappers = WRAPPERS

    # -- structure
    def modules(self, model) -> dict:
        return dict(model.named_modules())

    def optimizer_params(self, optimizer) -> list:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def owner_of(self, optimizer, candidates=None):
        """The module a training step calls with its batch: the latest module called at the top level (grad on,
        training mode; :data:`~ampsafe.torch.callhooks.TOP_CALLS`, kept by ``ampsafe run``) that holds the
        smallest covering module, else that smallest module. ultralytics' ``DetectionModel`` iterates its inner
        ``nn.Sequential`` without calling it: the Sequential covers every parameter, yet only the
        ``DetectionModel`` sees the batch, so only its inputs can be captured and replayed."""
        owner = super().owner_of(optimizer, candidates)
        if owner is None or candidates is not None:
            return owner
        from .callhooks import TOP_CALLS

        for module in TOP_CALLS.modules():
            if module is owner:
                return owner
            if any(m is owner for m in module.modules()):
                inner = getattr(module, "module", None)  # DDP / DataParallel: the model they call
                if type(module).__name__ in self.wrappers["module"] and inner is not None:
                    return inner
                return module
        return owner

    # -- state
    def state_slots(self, model) -> list[tuple[dict, str, torch.Tensor]]:
        """(holder dict, name, tensor) of every buffer: the slots a forward may rebind or write."""
        return [(m._buffers, n, b) for m in model.modules() for n, b in list(m._buffers.items()) if b is not None]

    def rng_state(self):
        """torch's CPU generator, its CUDA generators once CUDA is initialized, and Python's ``random``."""
        cpu = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        py = random.getstate()

        def restore() -> None:
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
            random.setstate(py)

        return restore

    # -- processes
    def world_size(self) -> int:
        """Processes in the default group (1 outside one)."""
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def all_gather(self, obj) -> list:
        import torch.distributed as dist

        if self.world_size() == 1:
            return [obj]
        gathered: list = [None] * dist.get_world_size()  # torch fills a list of world size
        dist.all_gather_object(gathered, obj)
        return gathered

    # -- hooks
    def forward_pre_hook(self, model, fn):
        """Kept outside the module (:mod:`ampsafe.torch.callhooks`): ``torch.save(model)`` and ``deepcopy`` work,
        and a copy (an EMA model, a checkpoint) neither carries the hook nor feeds it."""
        from .callhooks import pre_hook

        return pre_hook(model, fn)

    def forward_hook(self, module, fn):
        def hook(_module, _args, output) -> None:
            fn(output)  # None back: torch keeps the output

        return module.register_forward_hook(hook)

    # -- the rest of the adapter package
    def _package(self) -> core.Package:
        from . import trace, watch
        from .swaps import TorchSwaps

        return core.Package(TENSORS, TorchAmp(), TorchSwaps, trace, watch.Watch)


BACKEND = TorchBackend()
