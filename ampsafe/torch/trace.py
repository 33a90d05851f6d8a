"""Record one real forward of a torch model as a framework-neutral :class:`~ampsafe.core.graph.Graph`.

Why a ``TorchDispatchMode``: ``torch.fx`` and ``torch.export`` fail on detectors with data-dependent control
flow (torchvision's RPN), while the dispatch level sees every aten op that runs, including those inside
torchvision ops and composite functions, in train and eval mode alike. Global module hooks
(:mod:`ampsafe.torch.modstack`) attribute each op to its module.

Edges are real: tensors are keyed weakly (``WeakTensorKeyDictionary``), never by ``id()`` or ``data_ptr()``
which are recycled, and each write (in-place ``relu_``/``add_``, ``out=``) makes a new versioned tensor id;
a ``_version`` bump the trace did not see becomes an explicit ``mutated`` node.

What it cannot see: the backward of custom ``autograd.Function``s (their forward ops are recorded; their
gradients are measured only at their outputs), ops run in other threads, and branches not taken on the
example inputs. The graph's ``notes`` say so when it matters.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from .._framework import call
from ..core.graph import START_KINDS, Graph, OpKind, amax_value, path_flags
from . import modstack
from .ops import NON_EXPANDING_OPS, NORM_MODULE_TYPES, VIEW_OPS, canonical, runs_in_fp16

__all__ = ["trace", "preserved", "modules", "output_tensors"]


def modules(model) -> dict:
    """Module path -> module, as ``named_modules()`` spells it."""
    return dict(model.named_modules())


def _is_norm_module(module) -> bool:
    """A module that normalizes with plain ops (``x * scale + bias`` from running stats)."""
    if module is None:
        return False
    if type(module).__name__ in NORM_MODULE_TYPES:
        return True
    bufs = getattr(module, "_buffers", {})
    return "running_mean" in bufs and "running_var" in bufs


def output_tensors(obj) -> list:
    """Tensors inside a model output: tensors, tuples/lists/namedtuples, dicts, nested."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in output_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in output_tensors(v)]
    return []


def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _dedupe(tensors: list) -> list:
    out = []
    for t in tensors:
        if not any(t is o for o in out):
            out.append(t)
    return out


def _written_args(func, args, kwargs) -> list:
    """Tensors an op writes into (in-place self, ``out=``, BatchNorm running stats)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out.extend(t for t in tree_leaves(value) if _is_float(t))
    return out


class _Recorder(TorchDispatchMode):
    """Appends one graph node per aten op with a floating input; measures output abs-max; hooks gradients."""

    def __init__(self, graph: Graph, *, level: str, target: str, want_grads: bool):
        super().__init__()
        self.graph = graph
        self.level = level
        self.target = target
        self.want_grads = want_grads
        self.ids = WeakTensorKeyDictionary()  # tensor -> [tensor id, _version when that id was given]
        self.next_id = 0
        self.half: dict[int, bool] = {}
        self.pending: list[tuple[object, list]] = []  # (node, [0-dim abs-max tensors])
        self.grads: dict[int, object] = {}
        self.hooked: set[int] = set()
        self.handles: list = []
        self.custom_functions: set[str] = set()
        self.on_path: set[int] = set()  # tensors a conv/matmul path runs through
        self.watched: set[int] = set()  # those plus the outputs of the ops that end a path: they get grad hooks

    # tensor ids ---------------------------------------------------------------------------------------
    def _new(self, t, half: bool) -> int:
        tid = self.next_id
        self.next_id += 1
        self.ids[t] = [tid, _version(t)]
        self.half[tid] = half
        return tid

    def tid_of(self, t) -> int:
        entry = self.ids.get(t)
        if entry is None:  # a parameter, buffer, input or factory output: float16 only at O2
            return self._new(t, self.level == "O2")
        if entry[1] == _version(t):
            return entry[0]
        old = entry[0]  # written through a view or outside the trace: keep the edge, mark the write
        new = self._new(t, self.half[old])
        self.graph.add("mutated", OpKind.OTHER, modstack.current_module(), [old], [new], low_precision=self.half[old])
        return new

    def lookup(self, t) -> int | None:
        entry = self.ids.get(t)
        return None if entry is None else entry[0]

    # gradients -----------------------------------------------------------------------------------------
    def hook(self, t, tid: int) -> None:
        if tid in self.hooked or not t.requires_grad or t.grad_fn is None:
            return
        self.hooked.add(tid)
        if isinstance(t.grad_fn, torch.autograd.function.BackwardCFunction):
            self.custom_functions.add(type(t.grad_fn).__name__.removesuffix("Backward"))

        def on_grad(grad, tid=tid):
            if grad is not None and grad.is_floating_point() and grad.numel():
                lo, hi = torch.aminmax(grad.detach())
                m = torch.maximum(lo.abs(), hi.abs())
                prev = self.grads.get(tid)
                self.grads[tid] = m if prev is None else torch.maximum(prev, m)

        self.handles.append(t.register_hook(on_grad))

    # the recorder --------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _dedupe([t for t in tree_leaves((args, kwargs)) if _is_float(t)])
        if not inputs:
            return func(*args, **kwargs)
        op, kind = canonical(func, args)
        module = modstack.current_module()
        if kind not in START_KINDS and _is_norm_module(modstack.current_module_object()):
            kind = OpKind.NORM
        in_ids = [self.tid_of(t) for t in inputs]
        if self.want_grads:
            for t, tid in zip(inputs, in_ids):
                if tid in self.watched:
                    self.hook(t, tid)
        halves = [self.half[tid] for t, tid in zip(inputs, in_ids) if t.dim() > 0]
        low = runs_in_fp16(op, kind, halves, target=self.target, level=self.level)

        out = func(*args, **kwargs)

        produced = [t for t in tree_leaves(out) if _is_float(t)]
        produced = _dedupe(produced + _written_args(func, args, kwargs))
        out_ids = [self._new(t, low) for t in produced]
        on, carries = path_flags(kind, in_ids, self.on_path)
        if on:
            self.watched.update(out_ids)
        if carries:
            self.on_path.update(out_ids)
        first = produced[0] if produced else None
        node = self.graph.add(
            op,
            kind,
            module,
            in_ids,
            out_ids,
            module_type=type(modstack.current_module_object()).__name__ if module else "",
            shape=tuple(first.shape) if first is not None else None,
            dtype=str(first.dtype).removeprefix("torch.") if first is not None else "",
            low_precision=low,
        )
        if produced and op not in VIEW_OPS and op not in NON_EXPANDING_OPS:
            measured = produced[:1] if kind is OpKind.NORM else produced
            with torch.no_grad():
                maxima = []
                for t in measured:
                    if t.numel():
                        lo, hi = torch.aminmax(t.detach())
                        maxima.append(torch.maximum(lo.abs(), hi.abs()))
            if maxima:
                self.pending.append((node, maxima))
        return out

    def finish(self) -> None:
        """Turn the device-side maxima into floats (one sync at the end, not one per op)."""
        for node, maxima in self.pending:
            node.amax = amax_value(max(float(m) for m in maxima))
        self.pending.clear()
        if self.grads:
            producer = self.graph.producers()
            for tid, g in self.grads.items():
                idx = producer.get(tid)
                if idx is None:
                    continue
                node = self.graph.nodes[idx]
                node.grad_amax = amax_value(max(float(g), node.grad_amax or 0.0))
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _version(t) -> int:
    """``t._version``; inference-mode tensors have no version counter (and in-place writes on them go untracked)."""
    try:
        return t._version
    except RuntimeError:
        return -1


@contextmanager
def preserved(model):
    """Restore train/eval flags, buffers (BatchNorm statistics), ``.grad`` and RNG state on exit.

    A scan is an observation: whether it succeeds or the forward raises, the model must be as it was.
    Parameters are not copied (a forward does not write them); one written in place is named in the error.
    """
    modes = [(m, m.training) for m in model.modules()]
    buffers = [
        (m, name, b, b.detach().clone())
        for m in model.modules()
        for name, b in list(m._buffers.items())
        if b is not None
    ]
    params = [(name, p, p._version, p.grad) for name, p in model.named_parameters()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    py_rng = random.getstate()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for m, name, b, saved in buffers:  # always copied back: kernels may update stats without a version bump
                m._buffers[name] = b
                b.copy_(saved)
        for _, p, _, grad in params:
            p.grad = grad
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        random.setstate(py_rng)
        written = [name for name, p, version, _ in params if p._version != version]
        if written:
            from ..errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"the model's forward wrote parameters in place ({', '.join(written[:5])}); ampsafe.scan cannot "
                "restore them. Run scan on a copy of the model (copy.deepcopy)."
            )


def trace(
    model,
    example_inputs,
    *,
    level: str = "O1",
    target: str = "cuda",
    loss_fn=None,
    loss_scale: float | None = None,
) -> Graph:
    """Run ``model`` once on ``example_inputs`` (float32, as given) and return its recorded graph.

    With ``loss_fn``, ``loss_fn(output) * loss_scale`` is back-propagated and every hooked activation
    gets ``grad_amax`` (the scaled gradient's abs-max). Model state is restored afterwards in any case.
    Exceptions from the model propagate unchanged (``ampsafe.scan`` wraps them).
    """
    graph = Graph(framework="torch", level=level)
    want_grads = loss_fn is not None
    recorder = _Recorder(graph, level=level, target=target, want_grads=want_grads)
    with preserved(model):
        grads_saved = []
        try:
            with torch.set_grad_enabled(want_grads and torch.is_grad_enabled()), modstack.module_stack(model):
                with recorder:
                    output = call(model, example_inputs)
                    outs = output_tensors(output)
                    if want_grads:
                        for t in outs:
                            tid = recorder.lookup(t)
                            if tid is not None and tid in recorder.watched:
                                recorder.hook(t, tid)
                    graph.outputs = {tid for tid in map(recorder.lookup, outs) if tid is not None}
                    loss = loss_fn(output) if want_grads else None
                    if loss is not None:
                        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                            from ..errors import ConfigError

                            raise ConfigError("loss_fn(output) must return a scalar tensor")
                        graph.loss = recorder.lookup(loss)
            if loss is not None and loss.requires_grad:
                # fresh .grad tensors (restored by preserved()): never accumulate into the user's gradients
                for p in model.parameters():
                    grads_saved.append(p)
                    p.grad = None
                (loss * float(loss_scale if loss_scale is not None else 1.0)).backward()
            elif loss is not None:
                graph.notes.append("the loss does not require grad (no_grad model?): backward not measured")
        finally:
            recorder.finish()
            for p in grads_saved:
                p.grad = None
    if recorder.custom_functions:
        graph.notes.append(
            "custom autograd Functions (" + ", ".join(sorted(recorder.custom_functions)) + "): their forward ops "
            "were recorded; gradients inside them were not measured"
        )
    return graph
