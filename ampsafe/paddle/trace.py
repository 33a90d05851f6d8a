"""Record one real forward of a Paddle model as a framework-neutral :class:`~ampsafe.core.graph.Graph`.

Built on :mod:`ampsafe.paddle.intercept`: an :class:`~ampsafe.paddle.intercept.OpMode` sees every ``_C_ops``
kernel call and ``paddle.Tensor`` arithmetic dunder, so the functional ops between layers (DBFPN's
``F.upsample`` and ``+``) are in the graph, each attributed to its sublayer by ``intercept.module_stack``.
Which ops run in float16 comes from Paddle's own AMP lists (``ampsafe.paddle.amp_lists``), with float16
propagated through "gray" ops exactly as Paddle's promotion does.

Edges are real: tensors are keyed by a weak reference (checked for identity, so a recycled ``id()`` never
aliases) plus ``inplace_version``; a write the trace did not see becomes an explicit ``mutated`` node.
Not seen: kernels outside ``intercept.KERNEL_OPS`` (their outputs start fresh, unconnected tensors).

Paddle's fused ``rnn`` kernel (``nn.LSTM``, ``nn.GRU``, ``nn.SimpleRNN``; PaddleOCR's CRNN neck) is recorded as the
two things it does (:func:`_record_rnn`): its input GEMM, ``x @ W_ih^T + b_ih`` of the first layer, which the kernel
computes but never returns (a ``rnn_input_matmul`` node, a matmul that starts a path, measured by computing it again
in float32), then the recurrence, whose output is bounded by construction for LSTM (``o * tanh(c)``), GRU (a convex
mix of ``tanh`` and the previous state) and tanh RNNs: a bounded op where paths end. A ReLU RNN's output is an
unnormalized matmul output: it starts a path.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import paddle

from ..core import record
from ..core.graph import Graph, OpKind
from ..core.model import call
from . import intercept
from .emulate import paused as emulation_paused

__all__ = ["trace", "trace_hooks", "op_kind"]

_KINDS = {
    OpKind.CONV: {
        "conv2d",
        "depthwise_conv2d",
        "conv2d_transpose",
        "depthwise_conv2d_transpose",
        "conv3d",
        "conv3d_transpose",
    },
    OpKind.MATMUL: {
        "matmul",
        "bmm",
        "addmm",
        "einsum",
        "linear",
        "mul_matmul",
        "scaled_dot_product_attention",
        "flash_attention",
    },
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
_VIEWS |= {"split_with_num", "unbind", "expand"}

_ALIASING_METHODS = ("_use_gpudnn",)

# sublayers that normalize with running statistics written as plain ops (frozen BN variants in ppdet/ppocr)
NORM_LAYER_TYPES = frozenset({"FrozenBatchNorm2d", "FrozenBatchNorm", "FrozenBN", "BatchNormAct", "LayerNorm2d"})
# norms written as plain ops (mean, variance, rsqrt), by the class name's ending as on the torch side
# (ampsafe.torch.ops.PLAIN_NORM_SUFFIXES): ppdet's ViTDet and ConvNeXt channel-first LayerNorms, PaddleOCR's SR
# transformer LayerNorm; paddle.nn.LayerNorm itself is its layer_norm op
PLAIN_NORM_SUFFIXES = ("RMSNorm", "RmsNorm", "LayerNorm")


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
    """Kind of a canonical Paddle op; ``clip`` is bounded only with two finite bounds, ``rnn`` unless its cell is
    a ReLU RNN's."""
    if op == "rnn":
        return OpKind.MATMUL if _rnn_args(args, kwargs or {})["mode"] == "RNN_RELU" else OpKind.BOUNDED
    if op == "clip":
        kwargs = kwargs or {}
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        return OpKind.BOUNDED if _finite(lo) and _finite(hi) else OpKind.ELEMENTWISE
    return _KIND_OF.get(op, OpKind.ELEMENTWISE)


class _Hooks:
    """Paddle's tracer for :class:`ampsafe.core.record.Recorder` (see :class:`~ampsafe.core.record.TraceHooks`)."""

    tracks_unseen = True  # kernels outside intercept.KERNEL_OPS make tensors the trace never saw
    hooks_outputs_when_made = True  # a ``_C_ops`` call returns its outputs with their autograd node

    def __init__(self, backend, layers: dict, *, level: str, target: str):
        self.backend, self.layers, self.level, self.target = backend, layers, level, target

    def current_module(self):
        module = intercept.current_module()
        return module, self.layers.get(module)

    def is_norm_module(self, layer) -> bool:
        if layer is None:
            return False
        name = type(layer).__name__
        if name in NORM_LAYER_TYPES or name.endswith(PLAIN_NORM_SUFFIXES):
            return True
        return self.backend.norm_stats(layer) is not None

    @staticmethod
    def written(func, args, kwargs, inputs, versions) -> list:
        return [t for t, v in zip(inputs, versions) if t.inplace_version != v]

    @staticmethod
    def measured(op: str) -> bool:
        return op not in _VIEWS and op not in _NON_EXPANDING

    @contextmanager
    def recording(self, model, recorder, want_grads: bool):
        """The forward runs in float32 with any float16 emulation paused (no FP32 island: ``runs_low`` still says
        what runs in float16 at ``self.level``), so its values are the float32 ones the scan measures."""
        grad_ctx = paddle.enable_grad() if want_grads else paddle.no_grad()
        with _aliases_tracked(recorder), grad_ctx, intercept.module_stack(self.layers), emulation_paused():
            with intercept.op_mode(_OpRecorder(recorder, self.backend)):
                yield

    @staticmethod
    def backward(model, loss, scale: float) -> None:
        """``.grad`` of the trainable parameters is put back as it was afterwards."""
        params = [p for p in model.parameters() if not p.stop_gradient]
        saved = [(p, None if p.grad is None else p.grad.clone()) for p in params]
        try:
            with emulation_paused():  # the float32 forward's backward, ``loss * scale`` included
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


class _OpRecorder(intercept.OpMode):
    """Hands every intercepted op to the recorder, with its kind."""

    def __init__(self, recorder, backend):
        self.recorder, self.backend = recorder, backend

    def __call__(self, op, func, args, kwargs):
        if op == "rnn":
            return _record_rnn(self.recorder, func, args, kwargs)
        if op in _ATTENTION:
            probe = lambda: [_logits_amax(self.backend, op, args, kwargs)]  # noqa: E731
            return self.recorder.record(op, OpKind.MATMUL, func, args, kwargs, probe=probe)
        return self.recorder.record(op, op_kind(op, args, kwargs), func, args, kwargs)


# (positional names, the scale's keyword) of the attention functions intercept records as one op
_ATTENTION = {
    "scaled_dot_product_attention": (("query", "key", "value", "attn_mask", "dropout_p", "is_causal"), "scale"),
    "flash_attention": (("query", "key", "value", "dropout", "causal", "return_softmax"), "softmax_scale"),
}
_PROBE_ELEMENTS = 1 << 22  # logits per chunk of the float32 probe (16 MiB), whatever the sequence length


def _logits_amax(backend, op: str, args: tuple, kwargs: dict):
    """max |q k^T * scale| of an attention call, computed in float32 outside AMP (a 0-d tensor, no host sync).

    Why a probe: the fused kernel never stores these logits, and they are what would leave float16's range in a
    kernel that does (the math fallback stores ``matmul``'s output). Inputs are ``[batch, seq, heads, head_dim]``
    or unbatched ``[seq, heads, head_dim]``; grouped-query keys are repeated to the query's heads.
    """
    names, scale_key = _ATTENTION[op]
    bound = {**dict(zip(names, args)), **kwargs}
    q, k = bound["query"], bound["key"]
    scale = bound.get(scale_key)
    with backend.amp.float32():
        q, k = q.detach().astype("float32"), k.detach().astype("float32")
        if q.ndim == 3:
            q, k = q.unsqueeze(0), k.unsqueeze(0)
        q, k = q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3])
        if k.shape[1] != q.shape[1] and k.shape[1] and q.shape[1] % k.shape[1] == 0:
            k = paddle.repeat_interleave(k, q.shape[1] // k.shape[1], axis=1)
        scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
        step = max(1, _PROBE_ELEMENTS // max(1, q.shape[1] * q.shape[2] * k.shape[2]))
        best = paddle.zeros([], dtype="float32")
        for i in range(0, q.shape[0], step):
            logits = paddle.matmul(q[i : i + step] * scale, k[i : i + step], transpose_y=True)
            best = paddle.maximum(best, backend.tensors.abs_max(logits))
    return best


# the positional arguments of ``_C_ops.rnn`` (paddle/phi/ops/yaml/ops.yaml), as ``RNNBase._cudnn_impl`` passes them
_RNN_ARGS = (
    "x",
    "pre_state",
    "weight_list",
    "sequence_length",
    "dropout_state_in",
    "dropout_prob",
    "is_bidirec",
    "input_size",
    "hidden_size",
    "num_layers",
    "mode",
    "seed",
    "is_test",
)


def _rnn_args(args: tuple, kwargs: dict) -> dict:
    return {**dict(zip(_RNN_ARGS, args)), **kwargs}


def _input_weights(bound: dict) -> tuple[list, list]:
    """The first layer's (W_ih per direction, b_ih per direction) in ``weight_list``, laid out as
    ``RNNBase.flatten_parameters`` does for the fused kernel: every (W_ih, W_hh) pair by (layer, direction), then
    every (b_ih, b_hh) pair in the same order."""
    weights = list(bound["weight_list"])
    directions = 2 if bound["is_bidirec"] else 1
    biases = 2 * int(bound["num_layers"]) * directions
    return [weights[2 * d] for d in range(directions)], [weights[biases + 2 * d] for d in range(directions)]


def _input_matmuls(x, weights: list, biases: list) -> list:
    """``x @ W_ih^T + b_ih`` per direction, in float32 (``x``: time-major ``[time, batch, input]``)."""
    with paddle.no_grad():
        x = x.detach().astype("float32")
        return [
            paddle.matmul(x, w.astype("float32"), transpose_y=True) + b.astype("float32")
            for w, b in zip(weights, biases)
        ]


def _record_rnn(recorder, func, args: tuple, kwargs: dict):
    """One fused ``rnn`` call as two nodes: its first layer's input GEMM (a matmul node whose outputs are the
    gate pre-activations, recomputed in float32 since the kernel keeps them to itself), feeding the recurrence
    (bounded, or a matmul for a ReLU RNN), which also reads everything the kernel reads. Later layers' input GEMMs
    read the previous layer's bounded output: their size is the weights', not the path's."""
    bound = _rnn_args(args, kwargs)
    weights, biases = _input_weights(bound)
    gemm = recorder.record("rnn_input_matmul", OpKind.MATMUL, _input_matmuls, (bound["x"], weights, biases), {})

    def recurrence(_gemm, *a, **k):
        return func(*a, **k)

    return recorder.record("rnn", op_kind("rnn", args, kwargs), recurrence, (gemm, *args), kwargs)


def trace_hooks(backend, model, *, level: str, target: str = "cuda") -> _Hooks:
    """Paddle's :class:`~ampsafe.core.record.TraceHooks` for one trace of ``model`` (``backend``: Paddle's)."""
    return _Hooks(backend, backend.modules(model), level=backend.amp.check_level(level), target=target)


def trace(
    backend, model, example_inputs, *, level: str = "O1", target: str = "cuda", loss_fn=None, loss_scale=None
) -> Graph:
    """Run ``model`` once on ``example_inputs`` (float32) and return its recorded graph.

    ``target`` is accepted for symmetry with torch (Paddle's lists do not depend on it). With ``loss_fn``,
    ``loss_fn(output) * loss_scale`` is back-propagated; tensor hooks give each node's ``grad_amax`` and the
    parameters' ``.grad`` are restored afterwards.
    """
    return record.trace(
        backend,
        model,
        example_inputs,
        call=call,
        level=level,
        target=target,
        loss_fn=loss_fn,
        loss_scale=loss_scale,
        leaves=(*model.parameters(), *backend.tensors.leaves(example_inputs)),
    )


@contextmanager
def _aliases_tracked(recorder):
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
