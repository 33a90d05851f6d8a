"""The scan's recording algorithm, written once over a framework's :class:`TraceHooks` and ``backend.tensors``.

Why here: the torch and Paddle tracers see ops differently (a ``TorchDispatchMode`` / an ``intercept.OpMode``),
but what they do with an op is the same: give every tensor a versioned id, mark writes the trace did not see as
``mutated`` nodes, follow conv/matmul paths, hook the gradients on them, and measure output abs-maxes on the
device with one host sync at the end. The adapters' tracers only turn their framework's op into
:meth:`Recorder.record` and supply the hooks; every tensor fact comes from the Backend's ``tensors`` part
(:class:`~ampsafe.core.backend.Tensors`). :func:`trace` drives one recorded forward (and backward).
Pure Python: importing it imports neither torch nor paddle.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol

from ..errors import ConfigError, UnsupportedModelError
from .backend import Backend, Tensors
from .graph import MASK_FILL_OPS, START_KINDS, Graph, OpKind, amax_value, path_flags

__all__ = ["TraceHooks", "TraceHooksBase", "Recorder", "trace", "preserved"]

_LANE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.OTHER})
# What a norm written as plain ops (an RMSNorm's ``x.pow(2).mean()``) computes to normalize: float32 statistics of
# its input, not values of the path that ends there (x**2 would double the input's exponent).
_NORM_STATISTICS = frozenset({"pow", "square", "mean", "var", "std", "var_mean", "std_mean", "rsqrt", "sqrt", "sum"})


class TraceHooks(Protocol):
    """What the recorder needs from a framework's tracer for one trace of one model (``Backend.trace_hooks``), at
    the traced level: how it sees modules and ops, and what it does around the forward. Tensor facts are not
    here: they are ``backend.tensors``."""

    tracks_unseen: bool  # tensors that need grad may come from kernels the tracer cannot see (Paddle)
    hooks_outputs_when_made: bool  # an op's outputs can take a gradient hook as soon as the op returns

    def current_module(self) -> tuple[str, Any]:
        """(path, module object) of the innermost running module; ("", None) outside any."""

    def is_norm_module(self, module) -> bool:
        """A module that normalizes with plain ops (frozen BatchNorm): its ops count as ``NORM``."""

    def written(self, func, args, kwargs, inputs: list, versions: list) -> list:
        """Input tensors the op wrote into (in-place, ``out=``, running statistics)."""

    def measured(self, op: str) -> bool:
        """Whether the op's output abs-max is worth a reduction (not a view, not bounded by its input)."""

    def recording(self, model, recorder: Recorder, want_grads: bool) -> ContextManager:
        """Grad mode, module tracking and the op interception that calls ``recorder.record``."""

    def backward(self, model, loss, scale: float) -> None:
        """``(loss * scale).backward()`` into fresh ``.grad`` (the user's gradients are put back)."""


class TraceHooksBase:
    """The :class:`TraceHooks` facts that hold unless a tracer says otherwise: it sees every op that makes a
    tensor, and hooks an op's outputs where they are read."""

    tracks_unseen: bool = False
    hooks_outputs_when_made: bool = False


class Recorder:
    """One graph node per op with a floating input; output abs-max measured after it; gradients hooked."""

    def __init__(
        self,
        hooks: TraceHooks,
        tensors: Tensors,
        graph: Graph,
        *,
        level: str,
        want_grads: bool,
        runs_low: Callable[[str, OpKind, list[bool]], bool],
    ):
        self.hooks = hooks
        self.runs_low = runs_low  # backend.amp.runs_low at the traced level and target
        self.tensors = tensors
        self.graph = graph
        self.level = level
        self.want_grads = want_grads
        self.ids = tensors.id_map()  # tensor -> (tensor id, version when that id was given)
        self.next_id = 0
        self.half: dict[int, bool] = {}
        self.pending: list[tuple] = []  # (node, [0-d abs-max tensors], [0-d lane abs-maxes] or None)
        self.grads: dict[int, object] = {}  # tensor id -> abs-max of its gradient (0-d tensor)
        self.hooked: set[int] = set()
        self.handles: list = []
        self.custom_functions: set[str] = set()
        self.leaf_ids: set[int] = set()  # id() of parameters and model inputs: they legitimately have no producer
        self.unseen: set[str] = set()  # modules where a grad-carrying tensor came from an unseen kernel
        self.on_path: set[int] = set()  # tensors a conv/matmul path runs through
        self.watched: set[int] = set()  # those plus the outputs of the ops that end a path: their gradients count
        self.laned: set[int] = set()  # tensors measured with their mask lanes apart (lane_abs_max)
        self.opaque = 0  # > 0 while an op recorded as one node (SDPA) runs its inner ops: they are not recorded

    # tensor ids ---------------------------------------------------------------------------------------
    def _new(self, t, half: bool) -> int:
        tid = self.next_id
        self.next_id += 1
        self.ids[t] = (tid, self.tensors.version(t))
        self.half[tid] = half
        return tid

    def tid_of(self, t) -> int:
        entry = self.ids.get(t)
        if entry is None:  # a parameter, buffer, input or factory output: float16 only at O2
            if self.hooks.tracks_unseen and id(t) not in self.leaf_ids and self.tensors.requires_grad(t):
                self.unseen.add(self.hooks.current_module()[0])
            return self._new(t, self.level == "O2")
        if entry[1] == self.tensors.version(t):
            return entry[0]
        old = entry[0]  # written through a view or outside the trace: keep the edge, mark the write
        new = self._new(t, self.half[old])
        module = self.hooks.current_module()[0]
        self.graph.add("mutated", OpKind.OTHER, module, [old], [new], low_precision=self.half[old])
        return new

    def lookup(self, t) -> int | None:
        entry = self.ids.get(t)
        return None if entry is None else entry[0]

    def alias(self, src, dst) -> None:
        """``dst`` is another wrapper of ``src``'s data (Paddle's ``_use_gpudnn``): same tensor id."""
        ts = self.tensors
        if dst is src or not isinstance(dst, ts.tensor_type) or not ts.is_float(dst):
            return
        self.ids[dst] = (self.tid_of(src), ts.version(dst))

    # gradients -----------------------------------------------------------------------------------------
    def hook(self, t, tid: int) -> None:
        """Measure ``t``'s gradient (once per tensor id; retried while it has no gradient to hook)."""
        if tid in self.hooked:
            return

        ts = self.tensors

        def on_grad(grad, tid=tid):
            if grad is not None and ts.numel(grad):
                m = ts.abs_max(grad)
                prev = self.grads.get(tid)
                self.grads[tid] = m if prev is None else ts.maximum(prev, m)

        handle = ts.grad_hook(t, on_grad)
        if handle is None:
            return
        self.hooked.add(tid)
        self.handles.append(handle)
        name = ts.custom_function(t)
        if name:
            self.custom_functions.add(name)

    def mark_outputs(self, outputs: list) -> None:
        """The model's returned tensors: graph outputs, and their gradients count when on a path."""
        for t in outputs:
            tid = self.lookup(t)
            if self.want_grads and tid is not None and tid in self.watched:
                self.hook(t, tid)
        self.graph.outputs = {tid for tid in map(self.lookup, outputs) if tid is not None}

    # the recorder --------------------------------------------------------------------------------------
    def record(self, op: str, kind: OpKind, func, args, kwargs, *, probe: Callable | None = None):
        """Run ``func(*args, **kwargs)`` as canonical ``op`` of ``kind`` and record it; returns its output.

        ``probe()``: 0-d abs-max tensors of values the op computes but never returns (SDPA's QK logits, which
        flash kernels never materialize); they count for the node's ``amax``.
        """
        h, ts = self.hooks, self.tensors
        inputs = ts.float_leaves((args, kwargs))
        if not inputs or self.opaque:
            return func(*args, **kwargs)
        module, owner = h.current_module()
        statistic = False
        if kind not in START_KINDS and kind is not OpKind.FILL and h.is_norm_module(owner):
            statistic = op in _NORM_STATISTICS
            kind = OpKind.NORM
        in_ids = [self.tid_of(t) for t in inputs]
        versions = [ts.version(t) for t in inputs]
        if self.want_grads:
            for t, tid in zip(inputs, in_ids):
                if tid in self.watched:
                    self.hook(t, tid)
        halves = [self.half[tid] for t, tid in zip(inputs, in_ids) if ts.is_batched(t)]
        low = self.runs_low(op, kind, halves)

        out = func(*args, **kwargs)

        produced = ts.float_leaves([out])
        for t in h.written(func, args, kwargs, inputs, versions):
            if not any(t is p for p in produced):
                produced.append(t)
        on, carries = path_flags(kind, in_ids, self.on_path)
        out_ids = [self._new(t, low) for t in produced]
        if on:
            self.watched.update(out_ids)
            if self.want_grads and h.hooks_outputs_when_made:
                for t, tid in zip(produced, out_ids):
                    self.hook(t, tid)
        if carries:
            self.on_path.update(out_ids)
        first = produced[0] if produced else None
        shape, dtype = ts.describe(first) if first is not None else (None, "")
        node = self.graph.add(
            op,
            kind,
            module,
            in_ids,
            out_ids,
            module_type=type(owner).__name__ if module else "",
            shape=shape,
            dtype=dtype,
            low_precision=low,
        )
        if produced and kind is not OpKind.FILL and not statistic and h.measured(op):
            measured = [t for t in (produced[:1] if kind is OpKind.NORM else produced) if ts.numel(t)]
            with ts.no_grad():
                maxima = [ts.abs_max(t) for t in measured]
                if probe is not None:
                    maxima += list(probe())
                # mask lanes: see MASK_FILL_OPS (the rule); a conv/matmul output, or an elementwise op fed only
                # by path values, has none
                laned = kind in _LANE_KINDS and (
                    op in MASK_FILL_OPS or any(tid not in self.on_path or tid in self.laned for tid in in_ids)
                )
                lanes = [ts.lane_abs_max(t) for t in measured] if laned else None
                if laned:
                    self.laned.update(out_ids)
            if maxima:
                self.pending.append((node, maxima, lanes))
        return out

    def finish(self) -> None:
        """Turn the device-side maxima into floats (one pass at the end, not a sync per op); drop the hooks."""
        for node, maxima, lanes in self.pending:
            node.amax = amax_value(max(float(m) for m in maxima))
            if lanes:
                lane = amax_value(max(float(m) for m in lanes))
                node.lane_amax = lane if lane < node.amax else None
        self.pending.clear()
        if self.grads:
            producer = self.graph.producers()
            for tid, g in self.grads.items():
                idx = producer.get(tid)
                if idx is None:
                    continue
                node = self.graph.nodes[idx]
                node.grad_amax = amax_value(max(float(g), node.grad_amax or 0.0))
            self.grads.clear()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


@contextmanager
def _parameters_unwritten(params: list, version: Callable):
    """Raise when the traced forward wrote a parameter in place: scan is an observation and cannot undo that."""
    try:
        yield
    finally:
        written = [name for name, p, v in params if version(p) != v]
        if written:
            raise UnsupportedModelError(
                f"the model's forward wrote parameters in place ({', '.join(written[:5])}); ampsafe.scan cannot "
                "restore them. Run scan on a copy of the model (copy.deepcopy)."
            )


def trace(
    backend: Backend,
    model,
    example_inputs,
    *,
    call: Callable,
    level: str,
    target: str,
    loss_fn=None,
    loss_scale: float | None = None,
    leaves: tuple = (),
) -> Graph:
    """Run ``model`` once on ``example_inputs`` and return its recorded graph; model state restored in any case.

    ``backend``: the model's :class:`~ampsafe.core.backend.Backend` (its tracer's hooks, its tensor facts, its
    levels). With ``loss_fn``, ``loss_fn(output) * loss_scale`` is back-propagated and each hooked activation gets
    ``grad_amax``. ``call(model, inputs)`` runs the model; ``leaves`` are the parameters and inputs (they have no
    producer, and that is fine). Exceptions from the model propagate unchanged (``ampsafe.scan`` wraps them).
    """
    level = backend.amp.check_level(level)
    hooks, ts = backend.trace_hooks(model, level=level, target=target), backend.tensors
    graph = Graph(framework=backend.name, level=level)
    want_grads = loss_fn is not None
    runs_low = partial(backend.amp.runs_low, level=level, target=target)
    recorder = Recorder(hooks, ts, graph, level=level, want_grads=want_grads, runs_low=runs_low)
    recorder.leaf_ids = {id(t) for t in leaves}
    moved = {id(t) for t in backend.state_tensors(model)}  # what a forward may move (Paddle's statistics)
    params = [(name, p, ts.version(p)) for name, p in model.named_parameters() if id(p) not in moved]
    with _parameters_unwritten(params, ts.version), preserved(backend, model):
        try:
            with hooks.recording(model, recorder, want_grads):
                output = call(model, example_inputs)
                recorder.mark_outputs(ts.leaves(output))
                loss = loss_fn(output) if want_grads else None
                if loss is not None:
                    if not isinstance(loss, ts.tensor_type) or ts.numel(loss) != 1:
                        raise ConfigError("loss_fn(output) must return a scalar tensor")
                    graph.loss = recorder.lookup(loss)
            if loss is not None and ts.requires_grad(loss):
                hooks.backward(model, loss, float(loss_scale if loss_scale is not None else 1.0))
            elif loss is not None:
                graph.notes.append("the loss does not require grad (no_grad model?): backward not measured")
        finally:
            recorder.finish()
    graph.notes += _notes(recorder)
    return graph


@contextmanager
def preserved(backend: Backend, model):
    """Restore train/eval flags, the state a forward may move (``Backend.snapshot``) and the RNG on exit.

    A scan is an observation: whether it succeeds or the forward raises, the model must be as it was.
    Parameters are not copied (a forward does not write them; :func:`trace` names one written in place), and the
    user's ``.grad`` is the tracer's ``backward`` to keep.
    """
    modes = [(m, m.training) for m in backend.modules(model).values()]
    try:
        with backend.replay(model):  # state always copied back: kernels may update stats without a version bump
            yield
    finally:
        for m, training in modes:
            m.training = training


def _notes(recorder: Recorder) -> list[str]:
    """What the tracer could not see, for ``Graph.notes``: the inside of custom autograd Functions, and kernels
    it does not intercept (where ``TraceHooks.tracks_unseen``)."""
    notes = []
    if recorder.custom_functions:
        notes.append(
            "custom autograd Functions (" + ", ".join(sorted(recorder.custom_functions)) + "): their forward ops "
            "were recorded; gradients inside them were not measured"
        )
    if recorder.unseen:
        where = ", ".join(sorted(m or "<root>" for m in recorder.unseen)[:8])
        notes.append(
            f"tensors computed by kernels the tracer does not intercept entered the graph in: {where}; "
            "paths through those kernels are cut there"
        )
    return notes
