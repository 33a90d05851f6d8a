"""Which ops Paddle's AMP runs in float16, read from the installed Paddle (``paddle/amp/amp_lists.py``).

What Paddle 3.3.1 does (read in site-packages; the C++ half is ``GetAmpDestDtype`` in ``eager/amp_utils.h``):

- Lists: ``white_list()[dtype][level]`` is ``WHITE_LIST`` (+ fp16-only fused ops) at every level: conv2d,
  matmul/matmul_v2, linear_v2, mul, einsum, max_pool2d_with_index, ... (not depthwise_conv2d, not
  conv2d_transpose). ``black_list()[dtype]["O1"]`` is ``FP16_BLACK_LIST | EXTRA_BLACK_LIST`` (exp, log, pow,
  square, reduce_sum/mean, softmax, layer_norm, group_norm, losses, ... and every ``*_interp_v2``);
  ``black_list()[dtype]["O2"]`` is only ``EXTRA_BLACK_LIST`` (interpolation, lookup_table, scatter): exp,
  reciprocal, rsqrt, pow, softmax, ... are black at O1 only.
- Per op, at O1 and at O2 (``use_promote=True`` is the default): white -> float16; black -> float32; any
  other ("gray") op -> float16 only if none of its floating inputs is float32 (``batch_norm``/``layer_norm``
  look at ``X`` only), else float32. Paddle 2.4 (the seed's 2.4.2; ``python/paddle/fluid/dygraph/amp/
  auto_cast.py``) had no promotion at O2 (``use_promote`` came in 2.5): every op not on its O2 list
  ``PURE_FP16_BLACK_LIST`` (lookup_table(_v2), scatter(_grad), the five ``*_interp_v2``: 3.3.1's O2 list, a
  grad op aside) ran in float16, which is ``auto_cast(level="O2", use_promote=False)`` here.
- ``decorate(level="O2")`` casts every parameter to float16 except where ``need_keep_fp32`` says keep:
  layers with ``_cast_to_low_precision=False`` (``excluded_layers``), BatchNorm*/SyncBatchNorm, and for
  float16 LayerNorm and InstanceNorm*. At O1 parameters stay float32, so e.g. a conv bias add promotes the
  conv output back to float32, while bias-free conv -> BN -> relu chains stay float16.
- So at O2 ``exp`` is gray: with a float16 input (as in DBHead's step function) it runs in float16, under 2.4
  and 3.3.1 alike. Layers built with ``act=`` (``nn.BatchNorm(act="relu")``, PaddleOCR's DBHead) run their
  activation through ``paddle._legacy_C_ops``; ``intercept`` covers those too, else their output would look
  float32 and promote the rest of the head.
"""

from __future__ import annotations

from paddle.amp import amp_lists as _paddle_lists

from ..core.amp import LEVELS
from ..errors import ConfigError
from .intercept import amp_op_type

__all__ = ["LEVELS", "white_ops", "black_ops", "fp16_op_types", "runs_in_fp16", "check_level"]


def check_level(level: str, dtype: str = "float16") -> str:
    """Normalised level, or a ConfigError naming the accepted values."""
    norm = str(level).upper()
    if norm not in LEVELS:
        raise ConfigError(f"AMP level must be 'O1' or 'O2', got {level!r}")
    if dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"AMP dtype must be 'float16' or 'bfloat16', got {dtype!r}")
    return norm


def white_ops(level: str = "O1", dtype: str = "float16") -> frozenset[str]:
    """Paddle op types that always run in low precision at ``level``."""
    level = check_level(level, dtype)
    return frozenset(_paddle_lists.white_list()[dtype][level])


def black_ops(level: str = "O1", dtype: str = "float16") -> frozenset[str]:
    """Paddle op types that always run in float32 at ``level``."""
    level = check_level(level, dtype)
    return frozenset(_paddle_lists.black_list()[dtype][level])


def fp16_op_types(level: str = "O1", dtype: str = "float16") -> set[str]:
    """Paddle op types (AMP-list spelling) that run in float16 at ``level`` whatever their inputs: the white
    list. Every other op not in :func:`black_ops` follows its inputs (float16 iff none is float32): at O2,
    after ``decorate``, that is almost every op; see :func:`runs_in_fp16`."""
    return set(white_ops(level, dtype))


def runs_in_fp16(op: str, level: str = "O1", *, inputs_fp16: bool | None = None, dtype: str = "float16") -> bool:
    """Whether the canonical op ``op`` computes in float16 at ``level``.

    White-listed ops: True; black-listed: False; other ops follow their inputs: ``inputs_fp16`` when given,
    else the usual case at that level (O2: True, since decorated weights and fp16 producers feed them;
    O1: False, since float32 parameters and inputs promote them)."""
    kind = amp_op_type(op)
    if kind in white_ops(level, dtype):
        return True
    if kind in black_ops(level, dtype):
        return False
    if inputs_fp16 is not None:
        return bool(inputs_fp16)
    return check_level(level, dtype) == "O2"
