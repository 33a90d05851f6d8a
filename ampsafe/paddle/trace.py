"""Record one real forward of a Paddle model as a framework-neutral :class:`~ampsafe.core.graph.Graph`.

Built on :mod:`ampsafe.paddle.intercept`: an :class:`~ampsafe.paddle.intercept.OpMode` sees every ``_C_ops``
kernel call and ``paddle.Tensor`` arithmetic dunder, so the functional ops between layers (DBFPN's
``F.upsample`` and ``+``) are in the graph, each attributed to its sublayer by ``intercept.module_stack``.
Which ops run in float16 comes from Paddle's own AMP lists (``ampsafe.paddle.amp_lists``), with float16
propagated through "gray" ops exactly as Paddle's promotion does.

Edges are real: tensors are keyed by a weak reference (checked for identity, so a recycled ``id()`` never
aliases) plus ``inplace_version``; a write the trace did not see becomes an explicit ``mutated`` node.
Not seen: kernels outside ``intercept.KERNEL_OPS`` (their outputs start fresh, unconnected tensors).
"""

from __future__ import annotations

import math
import random
import weakref
from contextlib import contextmanager

import numpy as np
import paddle

from .._framework import call
from ..core.graph import START_KINDS, Graph, OpKind, amax_value, path_flags
from . import amp_lists, intercept

__all__ = ["trace", "preserved", "modules", "op_kind", "output_tensors"]

_FLOATS = {paddle.float16, paddle.float32, paddle.float64, paddle.bfloat16}

_KINDS = {
    OpKind.CONV: {
        "conv2d",
        "depthwise_conv2d",
        "conv2d_transpose",
        "depthwise_conv2d_transpose",
        "conv3d",
        "conv3d_transpose",
    },
    OpKind.MATMUL: {"matmul", "bmm", "addmm", "einsum", "linear", "mul_matmul"},
    OpKind.NORM: {"batch_norm", "sync_batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm"},
    OpKind.BOUNDED: {"sigmoid", "hardsigmoid", "tanh", "softmax", "log_softmax", "relu6", "sin", "cos", "erf"},
    OpKind.LOSS: {
        "bce_loss",
        "sigmoid_cross_entropy_with_logits",
        "cross_entropy_with_softmax",
        "huber_loss",
        "nll_loss",
        "kldiv_loss",
    },
    OpKind.REDUCTION: {"sum", "mean", "max", "min", "prod", "amax", "amin", "std", "var", "logsumexp", "cumsum"},
}
_KIND_OF = {op: kind for kind, ops in _KINDS.items() for op in ops}
# outputs bounded by their input's abs-max or by 1: not worth a reduction each
_NON_EXPANDING = {"relu", "relu6", "max_pool2d_with_index", "sigmoid", "hardsigmoid", "tanh", "softmax", "clip"}
_VIEWS = {"reshape", "transpose", "flatten", "squeeze", "unsqueeze", "slice", "strided_slice", "split"}
_VIEWS |= {"split_with_num", "expand"}

_ALIASING_METHODS = ("_use_gpudnn",)

# sublayers that normalize with running statistics written as plain ops (frozen BN variants in ppdet/ppocr)
NORM_LAYER_TYPES = frozenset({"FrozenBatchNorm2d", "FrozenBatchNorm", "FrozenBN", "BatchNormAct", "LayerNorm2d"})


def modules(model) -> dict:
    """Sublayer path -> sublayer, as ``named_sublayers()`` spells it, the root as ``""``."""
    return {"": model, **dict(model.named_sublayers())}


def _finite(x) -> bool:
    if x is None:
        return False
    if isinstance(x, paddle.Tensor):
        if x.size != 1:
            return False
        x = float(x)
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def op_kind(op: str, args: tuple = (), kwargs: dict | None = None) -> OpKind:
    """Kind of a canonical Paddle op; ``clip`` is bounded only with two finite bounds."""
    if op == "clip":
        kwargs = kwargs or {}
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        return OpKind.BOUNDED if _finite(lo) and _finite(hi) else OpKind.ELEMENTWISE
    return _KIND_OF.get(op, OpKind.ELEMENTWISE)


def _is_norm_layer(layer) -> bool:
    if layer is None:
        return False
    if type(layer).__name__ in NORM_LAYER_TYPES:
        return True
    stats = {**getattr(layer, "_buffers", {}), **getattr(layer, "_parameters", {})}
    return ("_mean" in stats and "_variance" in stats) or ("running_mean" in stats and "running_var" in stats)


def _leaves(obj) -> list:
    if isinstance(obj, paddle.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _leaves(v)]
    return []


output_tensors = _leaves


def _floats(tensors) -> list:
    out = []
    for t in tensors:
        if t.dtype in _FLOATS and not any(t is o for o in out):
            out.append(t)
    return out


class _Recorder(intercept.OpMode):
    """One graph node per intercepted op with a floating input; output abs-max measured after the op."""

    def __init__(self, graph: Graph, layers: dict, *, level: str, want_grads: bool):
        self.graph = graph
        self.layers = layers
        self.level = level
        self.want_grads = want_grads
        self.ids: dict[int, tuple] = {}  # id(tensor) -> (weakref, tensor id, inplace_version)
        self.next_id = 0
        self.half: dict[int, bool] = {}
        self.pending: list[tuple[object, list]] = []
        self.grads: dict[int, object] = {}  # tensor id -> abs-max of its gradient (0-d tensor)
        self.hooks: list = []
        self.leaf_ids: set[int] = set()  # parameters and model inputs: tensors that legitimately have no producer
        self.unseen: set[str] = set()  # modules where a grad-carrying tensor appeared from an unwrapped kernel
        self.on_path: set[int] = set()  # tensors a conv/matmul path runs through (only those get grad hooks)

    def _new(self, t, half: bool, on_path: bool = False) -> int:
        """A fresh tensor id; ``on_path`` tensors get a gradient hook when gradients are wanted."""
        tid = self.next_id
        self.next_id += 1
        key = id(t)
        ids = self.ids

        def forget(ref, key=key):
            entry = ids.get(key)
            if entry is not None and entry[0] is ref:
                del ids[key]

        ids[key] = (weakref.ref(t, forget), tid, t.inplace_version)
        self.half[tid] = half
        if on_path and self.want_grads and not t.stop_gradient:
            self._hook(t, tid)
        return tid

    def _hook(self, t, tid: int) -> None:
        """A tensor hook (not a layer backward hook: in-place ops and shared layers break those)."""

        def on_grad(grad, tid=tid):
            if grad is not None and grad.size:
                m = _abs_max(grad.detach())
                prev = self.grads.get(tid)
                self.grads[tid] = m if prev is None else paddle.maximum(prev, m)

        try:
            self.hooks.append(t.register_hook(on_grad))
        except (RuntimeError, ValueError):  # leaf tensors / tensors Paddle refuses to hook: not measured
            pass

    def alias(self, src, dst) -> None:
        """``dst`` is another Python wrapper of ``src``'s tensor (``x._use_gpudnn(False)`` in Paddle's pooling)."""
        if dst is src or not isinstance(dst, paddle.Tensor) or dst.dtype not in _FLOATS:
            return
        tid = self.tid_of(src)
        ids = self.ids
        key = id(dst)

        def forget(ref, key=key):
            entry = ids.get(key)
            if entry is not None and entry[0] is ref:
                del ids[key]

        ids[key] = (weakref.ref(dst, forget), tid, dst.inplace_version)

    def lookup(self, t) -> int | None:
        entry = self.ids.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def tid_of(self, t) -> int:
        entry = self.ids.get(id(t))
        if entry is None or entry[0]() is not t:
            if not t.stop_gradient and id(t) not in self.leaf_ids:
                self.unseen.add(intercept.current_module())  # made by a kernel the intercept does not wrap
            return self._new(t, self.level == "O2")
        if entry[2] == t.inplace_version:
            return entry[1]
        old = entry[1]
        new = self._new(t, self.half[old])
        self.graph.add("mutated", OpKind.OTHER, intercept.current_module(), [old], [new], low_precision=self.half[old])
        return new

    def __call__(self, op, func, args, kwargs):
        inputs = _floats(_leaves((args, kwargs)))
        if not inputs:
            return func(*args, **kwargs)
        kind = op_kind(op, args, kwargs)
        module = intercept.current_module()
        layer = self.layers.get(module)
        if kind not in START_KINDS and _is_norm_layer(layer):
            kind = OpKind.NORM
        in_ids = [self.tid_of(t) for t in inputs]
        versions = [t.inplace_version for t in inputs]
        halves = [self.half[tid] for t, tid in zip(inputs, in_ids) if t.size > 1]
        if kind is OpKind.NORM and halves:
            halves = halves[:1]  # Paddle's batch/layer norm follow X alone: float32 statistics do not promote
        if intercept.in_fp32_region():
            low = False
        else:
            low = amp_lists.runs_in_fp16(op, self.level, inputs_fp16=bool(halves) and all(halves))

        out = func(*args, **kwargs)

        produced = _floats(_leaves(out))
        produced += [
            t for t, v in zip(inputs, versions) if t.inplace_version != v and not any(t is p for p in produced)
        ]
        on, carries = path_flags(kind, in_ids, self.on_path)
        out_ids = [self._new(t, low, on) for t in produced]
        if carries:
            self.on_path.update(out_ids)
        first = produced[0] if produced else None
        node = self.graph.add(
            op,
            kind,
            module,
            in_ids,
            out_ids,
            module_type=type(layer).__name__ if module else "",
            shape=tuple(first.shape) if first is not None else None,
            dtype=str(first.dtype).replace("paddle.", "") if first is not None else "",
            low_precision=low,
        )
        if produced and op not in _VIEWS and op not in _NON_EXPANDING:
            measured = produced[:1] if kind is OpKind.NORM else produced
            with paddle.no_grad():
                maxima = [_abs_max(t.detach()) for t in measured if t.size]
            if maxima:
                self.pending.append((node, maxima))
        return out

    def finish(self) -> None:
        for node, maxima in self.pending:
            node.amax = amax_value(max(float(m) for m in maxima))
        self.pending.clear()


def _abs_max(t):
    """max |t| as a 0-d tensor, without materialising |t| (two reductions, no full-size temporary)."""
    return paddle.maximum(paddle.max(t), -paddle.min(t))


@contextmanager
def preserved(model):
    """Restore train/eval flags, buffers (BatchNorm statistics) and RNG states on exit, whatever happens."""
    layers = [model, *model.sublayers()]
    modes = [(layer, layer.training) for layer in layers]
    buffers = [
        (layer._buffers, name, b, b.clone())
        for layer in layers
        for name, b in list(layer._buffers.items())
        if b is not None
    ]
    # Paddle's BatchNorm keeps its running statistics as non-trainable *parameters* (_mean, _variance)
    buffers += [
        (layer._parameters, name, p, p.clone())
        for layer in layers
        for name, p in list(layer._parameters.items())
        if p is not None and (p.stop_gradient or not getattr(p, "trainable", True))
    ]
    params = [(name, p, p.inplace_version) for name, p in model.named_parameters() if not p.stop_gradient]
    rng = paddle.get_rng_state()
    cuda_rng = paddle.get_cuda_rng_state() if paddle.device.is_compiled_with_cuda() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    try:
        yield
    finally:
        for layer, training in modes:
            layer.training = training
        with paddle.no_grad():
            for holder, name, b, saved in buffers:
                holder[name] = b
                b.set_value(saved)
        paddle.set_rng_state(rng)
        if cuda_rng is not None:
            paddle.set_cuda_rng_state(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        written = [name for name, p, version in params if p.inplace_version != version]
        if written:
            from ..errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"the model's forward wrote parameters in place ({', '.join(written[:5])}); ampsafe.scan cannot "
                "restore them. Run scan on a copy of the model (copy.deepcopy)."
            )


def trace(model, example_inputs, *, level: str = "O1", target: str = "cuda", loss_fn=None, loss_scale=None) -> Graph:
    """Run ``model`` once on ``example_inputs`` (float32) and return its recorded graph.

    ``target`` is accepted for symmetry with torch (Paddle's lists do not depend on it). With ``loss_fn``,
    ``loss_fn(output) * loss_scale`` is back-propagated; tensor hooks give each node's ``grad_amax`` and the
    parameters' ``.grad`` are restored afterwards.
    """
    level = amp_lists.check_level(level)
    graph = Graph(framework="paddle", level=level)
    want_grads = loss_fn is not None
    layers = modules(model)
    recorder = _Recorder(graph, layers, level=level, want_grads=want_grads)
    recorder.model_params = [p for p in model.parameters() if not p.stop_gradient]
    recorder.leaf_ids = {id(p) for p in model.parameters()} | {id(t) for t in _leaves(example_inputs)}
    with preserved(model), _aliases_tracked(recorder):
        try:
            grad_ctx = paddle.enable_grad() if want_grads else paddle.no_grad()
            with grad_ctx, intercept.module_stack(model), intercept.op_mode(recorder):
                output = call(model, example_inputs)
                outs = _leaves(output)
                graph.outputs = {tid for tid in map(recorder.lookup, outs) if tid is not None}
                loss = loss_fn(output) if want_grads else None
                if loss is not None:
                    if not isinstance(loss, paddle.Tensor) or loss.size != 1:
                        from ..errors import ConfigError

                        raise ConfigError("loss_fn(output) must return a scalar paddle.Tensor")
                    graph.loss = recorder.lookup(loss)
            if loss is not None:
                _measure_grads(graph, recorder, loss, float(loss_scale if loss_scale is not None else 1.0))
        finally:
            recorder.finish()
            for h in recorder.hooks:
                h.remove()
            recorder.hooks.clear()
    if recorder.unseen:
        where = ", ".join(sorted(m or "<root>" for m in recorder.unseen)[:8])
        graph.notes.append(
            f"tensors computed by Paddle kernels the tracer does not intercept entered the graph in: {where}; "
            "paths through those kernels are cut there"
        )
    return graph


@contextmanager
def _aliases_tracked(recorder: _Recorder):
    """Keep edges through Paddle's re-wrapping helpers, which return a new Python Tensor for the same data."""
    patched = []
    for name in _ALIASING_METHODS:
        orig = getattr(paddle.Tensor, name, None)
        if orig is None:
            continue

        def wrapper(self, *args, _orig=orig, **kwargs):
            out = _orig(self, *args, **kwargs)
            recorder.alias(self, out)
            return out

        own = name in vars(paddle.Tensor)
        setattr(paddle.Tensor, name, wrapper)
        patched.append((name, orig, own))
    try:
        yield
    finally:
        for name, orig, own in reversed(patched):
            if own:
                setattr(paddle.Tensor, name, orig)
            else:
                delattr(paddle.Tensor, name)


def _measure_grads(graph: Graph, recorder: _Recorder, loss, scale: float) -> None:
    """Back-propagate ``loss * scale``; the parameters' ``.grad`` are put back as they were afterwards."""
    if loss.stop_gradient:
        graph.notes.append("the loss does not require grad: backward not measured")
        return
    params = recorder.model_params
    saved = [(p, None if p.grad is None else p.grad.clone()) for p in params]
    try:
        (loss * scale).backward()
    finally:
        for p, g in saved:
            if g is None:
                # after a hooked backward Paddle 3.3 needs a second call before .grad is really released
                for _ in range(3):
                    if p.grad is None:
                        break
                    p.clear_gradient(False)
            else:
                p.grad.set_value(g)
    producer = graph.producers()
    for tid, g in recorder.grads.items():
        idx = producer.get(tid)
        if idx is None:
            continue
        node = graph.nodes[idx]
        node.grad_amax = amax_value(max(float(g), node.grad_amax or 0.0))
