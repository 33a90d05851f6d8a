"""Canonical names and kinds for the aten ops a dispatch-level trace sees, and torch autocast's float16 lists.

A ``TorchDispatchMode`` sees ops after composite decomposition (``F.linear`` arrives as ``t`` + ``addmm``,
``F.interpolate`` as ``upsample_nearest2d``), so names are folded to the canonical spelling the rest of
ampsafe uses (``conv2d``, ``linear``, ``interpolate``, ``batch_norm``...). The autocast lists are torch's own
(``ATen/autocast_mode.h`` for CUDA, checked against ``torch.autocast("cpu")`` for CPU), spelled the same way.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..core.amp import check_level, check_target
from ..core.graph import OpKind

__all__ = [
    "canonical",
    "autocast_fp16_ops",
    "autocast_fp32_ops",
    "runs_in_fp16",
    "NORM_MODULE_TYPES",
    "VIEW_OPS",
    "NON_EXPANDING_OPS",
    "FILL_OPS",
    "PLAIN_NORM_SUFFIXES",
]

# aten name (overload packet, trailing "_" of in-place variants removed) -> canonical name
_RENAME = {
    "addmm": "linear",
    "mm": "matmul",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "_safe_softmax": "softmax",
    "native_batch_norm": "batch_norm",
    "_native_batch_norm_legit": "batch_norm",
    "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm",
    "cudnn_batch_norm": "batch_norm",
    "miopen_batch_norm": "batch_norm",
    "_batch_norm_impl_index": "batch_norm",
    "_batch_norm_with_update": "batch_norm",
    "_batch_norm_no_update": "batch_norm",
    "native_layer_norm": "layer_norm",
    "native_group_norm": "group_norm",
    "_fused_rms_norm": "rms_norm",
    "cat": "concat",
    "_to_copy": "cast",
    "native_dropout": "dropout",
    "max_pool2d_with_indices": "max_pool2d",
    "max_pool3d_with_indices": "max_pool3d",
    "nll_loss_forward": "nll_loss",
    "nll_loss2d_forward": "nll_loss",
    "nll_loss2d": "nll_loss",
    "multilabel_margin_loss_forward": "multilabel_margin_loss",
    "_scaled_dot_product_flash_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_cudnn_attention": "scaled_dot_product_attention",
    "_native_multi_head_attention": "multi_head_attention",
    "_transformer_encoder_layer_fwd": "transformer_encoder_layer",
    "_unsafe_view": "view",
    "_reshape_alias": "view",
    "clamp_min": "clamp_min",
    "relu6": "hardtanh",
}

_CONV_ATEN = {
    "convolution",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "mkldnn_convolution",
    "miopen_convolution",
    "miopen_depthwise_convolution",
    "_slow_conv2d_forward",
    "slow_conv3d_forward",
    "slow_conv_dilated2d",
    "slow_conv_dilated3d",
    "_conv_depthwise2d",
    "conv_depthwise3d",
    "slow_conv_transpose2d",
    "slow_conv_transpose3d",
    "_nnpack_spatial_convolution",
}
_MATMUL = {
    "linear",
    "matmul",
    "bmm",
    "baddbmm",
    "addbmm",
    "addmv",
    "mv",
    "addr",
    "dot",
    "vdot",
    "einsum",
    "linalg_vecdot",
    "scaled_dot_product_attention",
    "multi_head_attention",
    "transformer_encoder_layer",
    "_mkldnn_linear",
    "mkldnn_linear",
}
_NORM = {"batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm", "local_response_norm"}
_BOUNDED = {
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "hardsigmoid",
    "sin",
    "cos",
    "erf",
    "softsign",
    "hardtanh",
    "sign",
}
_LOSS = {
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "nll_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "soft_margin_loss",
    "multilabel_margin_loss",
    "multi_margin_loss",
    "margin_ranking_loss",
    "hinge_embedding_loss",
    "cosine_embedding_loss",
    "poisson_nll_loss",
    "triplet_margin_loss",
    "ctc_loss",
    "_ctc_loss",
    "cross_entropy_loss",
}
_REDUCTION = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "prod",
    "norm",
    "linalg_vector_norm",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "logsumexp",
    "cumsum",
    "cumprod",
    "nansum",
    "nanmean",
}
# ops that only reshape or re-slice their input (its values, in its dtype); :data:`VIEW_OPS` adds the other views
_RESHAPES = frozenset(
    {
        "view",
        "reshape",
        "permute",
        "transpose",
        "t",
        "expand",
        "squeeze",
        "unsqueeze",
        "flatten",
        "contiguous",
        "clone",
        "slice",
        "select",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
    }
)
_ELEMENTWISE = {
    "add",
    "sub",
    "rsub",
    "mul",
    "div",
    "neg",
    "abs",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "pow",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "square",
    "relu",
    "leaky_relu",
    "gelu",
    "silu",
    "hardswish",
    "mish",
    "elu",
    "selu",
    "celu",
    "softplus",
    "prelu",
    "_prelu_kernel",
    "threshold",
    "where",
    "concat",
    "stack",
    "interpolate",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "_adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool2d",
    "cast",
    "constant_pad_nd",
    "reflection_pad2d",
    "replication_pad2d",
    "pixel_shuffle",
    "dropout",
    "clamp_min",
    "clamp_max",
    "addcmul",
    "addcdiv",
    "lerp",
} | _RESHAPES
# ops whose output values do not come from their floating inputs' values: they allocate (``empty_like`` reads only
# a shape) or overwrite in place with constants or random draws. In train mode dropout records as
# ``empty_like -> bernoulli_ -> div -> mul``: the ``empty_like`` output is uninitialized memory, never a value.
FILL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "new_empty_strided",
        "bernoulli",
        "uniform",
        "normal",
        "fill",
        "zero",
        "random",
        "exponential",
        "geometric",
        "cauchy",
        "log_normal",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_zeros",
        "new_ones",
        "new_full",
    }
)

# ops that only re-label storage: their values equal (a subset of) their input's, so measuring them is waste
VIEW_OPS = _RESHAPES | frozenset(
    {
        "detach",
        "alias",
        "lift_fresh",
        "as_strided",
        "unfold",
        "narrow",
        "expand_as",
        "view_as",
    }
)

# ops whose output is bounded by their input's abs-max or by 1: nothing to learn from measuring them
NON_EXPANDING_OPS = frozenset(
    {"relu", "relu6", "hardtanh", "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool2d"}
    | {"sigmoid", "tanh", "hardsigmoid", "softmax", "sign", "sin", "cos", "erf", "softsign"}
)

# Modules that normalize with a per-channel affine of running statistics written out as plain ops
# (``x * scale + bias``), so no aten norm op shows it: torchvision's FrozenBatchNorm2d, timm's variants.
NORM_MODULE_TYPES = frozenset(
    {
        "FrozenBatchNorm2d",
        "FrozenBatchNorm",
        "FrozenBatchNormAct2d",
        "BatchNormAct2d",
        "SyncBatchNormAct",
        "GroupNormAct",
        "GroupNorm1Act",
        "LayerNormAct",
        "LayerNormAct2d",
        "LayerNorm2d",
        "LayerNorm3d",
        "RmsNorm",
        "RmsNorm2d",
        "RMSNorm",
    }
)

# Transformer norms written as plain ops (HF's ``T5LayerNorm``, ``LlamaRMSNorm``, ``Qwen2RMSNorm``...): by the
# class name's ending, since every model family defines its own.
PLAIN_NORM_SUFFIXES = ("RMSNorm", "RmsNorm", "LayerNorm")


def _base_name(func) -> str:
    name = func._overloadpacket.__name__
    if name.endswith("_") and not name.startswith("__") and name not in _RENAME:
        name = name[:-1]
    return _RENAME.get(name, name)


@lru_cache(maxsize=4096)
def _classify(func) -> tuple[str, OpKind]:
    name = _base_name(func)
    if func.namespace == "torchvision":
        return name, OpKind.OTHER
    if name in _CONV_ATEN:
        return "conv2d", OpKind.CONV
    if name.startswith("upsample") or name.startswith("_upsample"):
        return "interpolate", OpKind.ELEMENTWISE
    for names, kind in (
        (FILL_OPS, OpKind.FILL),
        (_MATMUL, OpKind.MATMUL),
        (_NORM, OpKind.NORM),
        (_BOUNDED, OpKind.BOUNDED),
        (_LOSS, OpKind.LOSS),
        (_REDUCTION, OpKind.REDUCTION),
        (_ELEMENTWISE, OpKind.ELEMENTWISE),
    ):
        if name in names:
            return name, kind
    return name, OpKind.OTHER


def _finite_number(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def canonical(func, args: tuple) -> tuple[str, OpKind]:
    """Canonical op name and :class:`OpKind` of an aten ``OpOverload`` called with ``args``.

    Argument-dependent cases: convolutions get their spatial rank (``conv1d``..``conv3d``, ``conv_transpose2d``);
    ``clamp`` is bounded only with two finite bounds; ``hardtanh(0, 6)`` is ``relu6``.
    """
    name, kind = _classify(func)
    if kind is OpKind.CONV:
        weight = args[1] if len(args) > 1 else None
        rank = max(getattr(weight, "ndim", 4) - 2, 1)
        transposed = len(args) > 6 and args[6] is True and _base_name(func) in {"convolution", "_convolution"}
        if "transpose" in _base_name(func):
            transposed = True
        return (f"conv_transpose{rank}d" if transposed else f"conv{rank}d"), kind
    if name == "clamp":
        lo = args[1] if len(args) > 1 else None
        hi = args[2] if len(args) > 2 else None
        return name, (OpKind.BOUNDED if _finite_number(lo) and _finite_number(hi) else OpKind.ELEMENTWISE)
    if name == "hardtanh" and len(args) >= 3 and args[1] == 0 and args[2] == 6:
        return "relu6", OpKind.BOUNDED
    return name, kind


# --- torch autocast lists, in canonical names ------------------------------------------------------------

# The convolutions and matrix products autocast runs in float16 on CUDA and on CPU alike
# (ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP)
_BOTH_FP16 = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "linear",
        "matmul",
        "einsum",
        "linalg_vecdot",
        "addbmm",
        "baddbmm",
        "bmm",
        "linalg_multi_dot",
        "scaled_dot_product_attention",
    }
)
# CUDA "lower_precision_fp" adds the matrix-vector products and the RNN cells
_CUDA_FP16 = _BOTH_FP16 | {
    "mv",
    "addmv",
    "addr",
    "chain_matmul",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
}
# CPU "lower_precision_fp" adds multi-head attention (checked with torch.autocast("cpu"))
_CPU_FP16 = _BOTH_FP16 | {"multi_head_attention"}
# CUDA "fp32" and "fp32_set_opt_dtype": these compute in float32 whatever their inputs are
_CUDA_FP32 = frozenset(
    {
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "softplus",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "norm",
        "cosine_similarity",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "interpolate",
        "prod",
        "softmax",
        "log_softmax",
        "cumprod",
        "cumsum",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "sum",
    }
    | _LOSS
)
# CPU runs most math in the input dtype; its fp32 list is mostly losses and a few reductions
_CPU_FP32 = frozenset({"prod", "cdist", "dist", "pdist", "renorm", "binary_cross_entropy"} | _LOSS)


def _check(target: str, level: str) -> None:
    check_level(level)
    check_target(target)


def autocast_fp16_ops(target: str = "cuda", level: str = "O1") -> frozenset[str] | None:
    """Canonical names of the ops torch autocast runs in float16 on ``target``.

    ``level="O2"`` returns None, meaning *every* floating op (as after ``model.half()``).
    """
    _check(target, level)
    if level == "O2":
        return None
    return _CUDA_FP16 if target == "cuda" else _CPU_FP16


def autocast_fp32_ops(target: str = "cuda") -> frozenset[str]:
    """Ops autocast forces to float32 on ``target`` (they never run in float16 at O1)."""
    _check(target, "O1")
    return _CUDA_FP32 if target == "cuda" else _CPU_FP32


def runs_in_fp16(op: str, kind: OpKind, input_halves: list[bool], *, target: str = "cuda", level: str = "O1") -> bool:
    """Whether ``op`` would compute in float16 under autocast, given which floating inputs would be float16.

    Ops outside autocast's lists run in the promoted type of their inputs, so float16 spreads from conv/matmul
    outputs through adds, activations and resamples until an fp32-list op or a float32 operand stops it.
    ``input_halves`` lists the *non-scalar* floating inputs.
    """
    fp16 = autocast_fp16_ops(target, level)
    if fp16 is None:
        return True
    if op in fp16:
        return True
    if op in autocast_fp32_ops(target) or not input_halves:
        return False
    if kind is OpKind.NORM and op == "batch_norm":
        return input_halves[0]  # batch_norm accepts float16 activations with float32 statistics
    return all(input_halves)
