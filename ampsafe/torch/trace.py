"""Record one real forward of a torch model as a framework-neutral :class:`~ampsafe.core.graph.Graph`.

Why a ``TorchDispatchMode``: ``torch.fx`` and ``torch.export`` fail on detectors with data-dependent control
flow (torchvision's RPN), while the dispatch level sees every aten op that runs, including those inside
torchvision ops and composite functions, in train and eval mode alike. Global module hooks
(:mod:`ampsafe.torch.modstack`) attribute each op to its module.

Edges are real: tensors are keyed weakly (``core.backend.WeakIds``: an ``id()`` checked through a weak reference,
so a recycled ``id()`` or ``data_ptr()`` never aliases), and each write (in-place ``relu_``/``add_``, ``out=``)
makes a new versioned tensor id; a ``_version`` bump the trace did not see becomes an explicit ``mutated`` node.

What it cannot see: the backward of custom ``autograd.Function``s (their forward ops are recorded; their
gradients are measured only at their outputs), ops run in other threads, and branches not taken on the
example inputs. The graph's ``notes`` say so when it matters.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..core import record
from ..core.graph import Graph, OpKind
from ..core.model import call
from . import modstack
from .ops import NON_EXPANDING_OPS, NORM_MODULE_TYPES, PLAIN_NORM_SUFFIXES, VIEW_OPS, canonical
from .tensors import TENSORS

__all__ = ["trace", "trace_hooks"]


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and TENSORS.is_float(x)


def _written_args(func, args, kwargs) -> list:
    """Tensors an op writes into (in-place self, ``out=``, BatchNorm running stats); none for a Python function."""
    out = []
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out.extend(t for t in tree_leaves(value) if _is_float(t))
    return out


class _Hooks(record.TraceHooksBase):
    """torch's tracer for :class:`ampsafe.core.record.Recorder` (see :class:`~ampsafe.core.record.TraceHooks`).
    The base's facts hold: the dispatch level sees every op, and an output has no autograd node until dispatch
    returns, so gradients are hooked where the tensor is read."""

    def __init__(self, backend, *, level: str, target: str):
        self.backend, self.level, self.target = backend, level, target

    @staticmethod
    def current_module():
        return modstack.current_module(), modstack.current_module_object()

    def is_norm_module(self, module) -> bool:
        """A module that normalizes with plain ops (``x * scale + bias`` from running stats)."""
        if module is None:
            return False
        name = type(module).__name__
        if name in NORM_MODULE_TYPES or name.endswith(PLAIN_NORM_SUFFIXES):
            return True
        return self.backend.norm_stats(module) is not None

    @staticmethod
    def written(func, args, kwargs, inputs, versions) -> list:
        return _written_args(func, args, kwargs)

    @staticmethod
    def measured(op: str) -> bool:
        return op not in VIEW_OPS and op not in NON_EXPANDING_OPS

    @contextmanager
    def recording(self, model, recorder, want_grads: bool):
        with (
            torch.set_grad_enabled(want_grads and torch.is_grad_enabled()),
            modstack.module_stack(self.backend.modules(model)),
        ):
            with _DispatchRecorder(recorder), _AttentionRecorder(recorder, self.backend.amp):
                yield

    @staticmethod
    def backward(model, loss, scale: float) -> None:
        """Into fresh ``.grad`` tensors, never accumulated into the user's, which are put back afterwards."""
        saved = [(p, p.grad) for p in model.parameters()]
        for p, _ in saved:
            p.grad = None
        try:
            (loss * scale).backward()
        finally:
            for p, grad in saved:
                p.grad = grad


class _DispatchRecorder(TorchDispatchMode):
    """Hands every aten op to the recorder, as its canonical name and kind."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.recorder.opaque or not any(_is_float(t) for t in tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        op, kind = canonical(func, args)
        return self.recorder.record(op, kind, func, args, kwargs)


_SDPA = torch.nn.functional.scaled_dot_product_attention
_PROBE_ELEMENTS = 1 << 22  # logits per chunk of the float32 probe (16 MiB), whatever the sequence length


class _AttentionRecorder(TorchFunctionMode):
    """Records ``F.scaled_dot_product_attention`` as one op, whichever kernel runs it, with its QK logits measured.

    Why: the flash and efficient kernels never materialize the logits ``q @ k^T * scale`` whose float16 range is
    the risk, and the math fallback (train mode with dropout, some masks) spreads them over a dozen aten ops
    where the additive mask's ``finfo.min`` lanes look like values. One node, started like a matmul, with the
    logits' abs-max from a float32 probe (:func:`_logits_amax`) counted in its ``amax``, says what autocast's
    float16 SDPA would hold; the mask is an input of that node and never a value on its path.
    """

    def __init__(self, recorder, amp):
        super().__init__()
        self.recorder, self.amp = recorder, amp

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA or self.recorder.opaque:
            return func(*args, **kwargs)
        recorder = self.recorder

        def run(*a, **kw):
            recorder.opaque += 1
            try:
                return func(*a, **kw)
            finally:
                recorder.opaque -= 1

        return recorder.record(
            "scaled_dot_product_attention",
            OpKind.MATMUL,
            run,
            args,
            kwargs,
            probe=lambda: [self._probe(args, kwargs)],
        )

    def _probe(self, args, kwargs):
        self.recorder.opaque += 1
        try:
            with self.amp.float32():
                return _logits_amax(*_sdpa_qk(args, kwargs))
        finally:
            self.recorder.opaque -= 1


def _sdpa_qk(args, kwargs) -> tuple:
    """(query, key, scale, enable_gqa) of an ``F.scaled_dot_product_attention`` call."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    bound = dict(zip(names, args)) | kwargs
    return bound["query"], bound["key"], bound.get("scale"), bool(bound.get("enable_gqa", False))


def _logits_amax(q, k, scale, gqa: bool):
    """max |q @ k^T * scale| computed in float32, in chunks of the batch and head dims (no host sync)."""
    q, k = q.detach().float(), k.detach().float()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)  # grouped-query attention
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q = q.expand(*lead, *q.shape[-2:]).reshape(-1, *q.shape[-2:])
    k = k.expand(*lead, *k.shape[-2:]).reshape(-1, *k.shape[-2:])
    step = max(1, _PROBE_ELEMENTS // max(1, q.shape[-2] * k.shape[-2]))
    best = torch.zeros((), device=q.device)
    for i in range(0, q.shape[0], step):
        logits = torch.bmm(q[i : i + step] * scale, k[i : i + step].transpose(-1, -2))
        best = torch.maximum(best, logits.abs().amax())
    return best


def trace_hooks(backend, model, *, level: str, target: str) -> _Hooks:
    """torch's :class:`~ampsafe.core.record.TraceHooks` for one trace of ``model`` (``backend``: torch's)."""
    return _Hooks(backend, level=level, target=target)


def trace(
    backend,
    model,
    example_inputs,
    *,
    level: str = "O1",
    target: str = "cuda",
    loss_fn=None,
    loss_scale: float | None = None,
) -> Graph:
    """Run ``model`` once on ``example_inputs`` (float32, as given) and return its recorded graph (``backend``:
    torch's, which hands itself in).

    With ``loss_fn``, ``loss_fn(output) * loss_scale`` is back-propagated and every hooked activation
    gets ``grad_amax`` (the scaled gradient's abs-max). Model state is restored afterwards in any case.
    Exceptions from the model propagate unchanged (``ampsafe.scan`` wraps them).
    """
    return record.trace(
        backend, model, example_inputs, call=call, level=level, target=target, loss_fn=loss_fn, loss_scale=loss_scale
    )
