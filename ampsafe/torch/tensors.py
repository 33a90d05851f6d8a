"""PyTorch's :class:`~ampsafe.core.backend.Tensors` (``TorchBackend.tensors``): every torch tensor fact the
tracer, the watcher and the heal read, stated here once."""

from __future__ import annotations

import torch

from ..core.backend import TensorsBase

__all__ = ["TorchTensors", "TENSORS", "LOW_DTYPES"]

LOW_DTYPES = (torch.float16, torch.bfloat16)  # the low-precision float dtypes AMP computes in


class TorchTensors(TensorsBase):
    """``torch.Tensor``: versioned by ``_version``, data identified by its storage pointer; the facts ``torch``
    spells as the base reads them are the base's."""

    lib = torch

    @staticmethod
    def checkable(t) -> bool:
        return t.is_floating_point() and t.device.type != "meta" and not t.is_sparse

    @staticmethod
    def is_batched(t) -> bool:
        return t.dim() > 0

    @staticmethod
    def version(t) -> int:
        """``t._version``; inference-mode tensors have none (and their in-place writes go untracked): -1."""
        try:
            return t._version
        except RuntimeError:
            return -1

    @staticmethod
    def key(t) -> int:
        """The storage's data pointer: views and ``detach()`` copies of a parameter or input share it."""
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return -1

    def grads_finite(self, params, loss=None) -> bool:
        """Each gradient's L2 norm by one fused call per (device, dtype), accumulated in float32: NaN and inf reach
        the norm, and so does a norm past float32's range (~1.8e19), a diverged step either way."""
        by_kind: dict = {}
        for p in params:
            grad = p.grad
            if grad is not None:
                grad = grad._values() if grad.is_sparse else grad
                by_kind.setdefault((grad.device, grad.dtype), []).append(grad)
        losses = self.checkable_leaves(loss)
        if not by_kind and not losses:
            return True
        flags = []
        with torch.no_grad():
            for (_device, dtype), grads in by_kind.items():
                wide = None if dtype in (torch.float32, torch.float64) else torch.float32
                flags.append(torch.stack(torch._foreach_norm(grads, 2.0, dtype=wide)).isfinite().all())
            flags += [torch.isfinite(t.detach()).all() for t in losses]
            device = flags[0].device
            ok = torch.stack([f.to(device) for f in flags]).all() if len(flags) > 1 else flags[0]
        return bool(ok.item())

    @staticmethod
    def grad_norm(params) -> float | None:
        """One fused norm per tensor (no float32 copy of each gradient), one host sync."""
        grads = [p.grad.detach() for p in params if getattr(p, "grad", None) is not None]
        if not grads:
            return None
        norms = torch._foreach_norm(grads)
        return float(torch.linalg.vector_norm(torch.stack([n.float().to(norms[0].device) for n in norms])))

    @staticmethod
    def abs_max(t):
        """``aminmax``: two reductions in one kernel, no full-size ``|t|`` temporary."""
        lo, hi = torch.aminmax(t.detach())
        return torch.maximum(lo.abs(), hi.abs()).float()

    @staticmethod
    def assign(targets: list, values: list) -> None:
        if targets:
            with torch.no_grad():
                torch._foreach_copy_(targets, values)

    @staticmethod
    def requires_grad(t) -> bool:
        return t.requires_grad

    @staticmethod
    def grad_hook(t, fn):
        """On the tensor's autograd node: an op output has none until dispatch returns, so it is hooked where the
        tensor is read (see ``TraceHooks.hooks_outputs_when_made``)."""
        if not t.requires_grad or t.grad_fn is None:
            return None

        def on_grad(grad):
            if grad is not None and grad.is_floating_point():
                fn(grad)

        return t.register_hook(on_grad)

    @staticmethod
    def custom_function(t):
        node = t.grad_fn
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            return type(node).__name__.removesuffix("Backward")
        return None


TENSORS = TorchTensors()
