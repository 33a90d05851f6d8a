"""Paddle op interception: a mode stack, like torch's ``TorchFunctionMode``.

Paddle has no single hookable point: ``x + y`` is a C method of ``paddle.Tensor``, ``paddle.exp`` *is* the
C function ``paddle._C_ops.exp`` (bound by identity in several modules), and layers reach their kernels through
``F.conv._conv_nd`` / names imported at module load. Paddle's own AMP decides float16 vs float32 per
``_C_ops`` kernel call, so that is the level intercepted here: every binding of the listed ``_C_ops``
functions (in ``paddle._C_ops``, in any ``paddle.*`` module that imported one by name, and in the
``paddle.Tensor`` class), the activations layers built with ``act=`` reach through ``paddle._legacy_C_ops``
(``LEGACY_ACTIVATIONS``), plus the arithmetic dunders of ``paddle.Tensor``, and the Python attention functions
(``F.scaled_dot_product_attention``, ``flash_attention``: ``ATTENTION_FUNCTIONS``) as one op each. One op here is
one op Paddle AMP sees (``F.conv2d`` with a bias is ``conv2d`` then ``add``, exactly as on a GPU).

Wrappers are installed when the outermost :func:`op_mode` is entered and removed in ``finally`` when it
exits, so code outside pays nothing. While a mode handles an op, ops it runs itself (and the kernels inside
the op) are not intercepted again.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Iterator

import paddle

from ..core.ledger import AttrPatches

__all__ = [
    "OpMode",
    "op_mode",
    "active_modes",
    "amp_op_type",
    "KERNEL_OPS",
    "LEGACY_ACTIVATIONS",
    "ATTENTION_FUNCTIONS",
    "module_stack",
    "current_module",
    "fp32_region",
    "in_fp32_region",
]

# _C_ops kernel name -> canonical op name (graph.Node.op). Kernels not listed are not intercepted.
_SAME = """
conv2d depthwise_conv2d conv2d_transpose depthwise_conv2d_transpose conv3d conv3d_transpose
matmul bmm addmm einsum linear linear_v2 add subtract divide scale maximum minimum elementwise_pow pow square abs
clip relu relu6 leaky_relu sigmoid hardsigmoid hardswish swish silu gelu tanh mish softplus elu selu prelu
exp expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos erf logsumexp cumsum cumprod
sum mean max min prod amax amin std var
concat stack split split_with_num unbind reshape transpose flatten squeeze unsqueeze slice strided_slice expand tile
pad pad3d gather gather_nd index_select roll flip where
pool2d pool3d max_pool2d_with_index adaptive_pool2d
batch_norm layer_norm group_norm instance_norm sync_batch_norm
softmax log_softmax dropout rnn
bce_loss sigmoid_cross_entropy_with_logits cross_entropy_with_softmax huber_loss nll_loss kldiv_loss
""".split()
KERNEL_OPS: dict[str, str] = {name: name for name in _SAME}
KERNEL_OPS.update(
    {
        "multiply": "mul",
        "batch_norm_": "batch_norm",
        "sync_batch_norm_": "sync_batch_norm",
        "nearest_interp": "interpolate",
        "bilinear_interp": "interpolate",
        "bicubic_interp": "interpolate",
        "linear_interp": "interpolate",
        "trilinear_interp": "interpolate",
        "linear_v2": "linear",
        "depthwise_conv2d_bias": "depthwise_conv2d",
    }
)

# Activations that Paddle reaches through ``paddle._legacy_C_ops`` (legacy name -> canonical op): every layer
# built with ``act=`` (``nn.BatchNorm(..., act="relu")``, as PaddleOCR's DBHead and many PaddleOCR / PaddleDetection
# layers are) ends in ``base.dygraph_utils._append_activation_in_dygraph``, which looks the op up on
# ``_legacy_C_ops`` by name at call time. On a GPU they pass through Paddle's AMP like any other op (the imperative
# tracer casts their inputs); not intercepted, their outputs would be fresh float32 tensors to every mode here (the
# float16 emulator would then promote everything downstream to float32).
LEGACY_ACTIVATIONS: dict[str, str] = {
    "relu": "relu",
    "relu6": "relu6",
    "leaky_relu": "leaky_relu",
    "sigmoid": "sigmoid",
    "hard_sigmoid": "hardsigmoid",
    "hard_swish": "hardswish",
    "swish": "swish",
    "silu": "silu",
    "gelu": "gelu",
    "tanh": "tanh",
    "mish": "mish",
    "softplus": "softplus",
    "elu": "elu",
}

# Python-level attention functions intercepted as one op each ((module, attribute) -> canonical op): on a GPU they
# reach one fused kernel (``flash_attn``, white-listed) that never stores the QK logits, and on a CPU they fall
# back to ``_math_attention``'s matmul / add / softmax / matmul. One op in every mode says what the fused kernel
# does whichever backend runs: the tracer records one node (its logits measured by a float32 probe), the float16
# emulator rounds its inputs and output as a white-listed kernel's, the sentinel names it.
ATTENTION_FUNCTIONS: dict[tuple[str, str], str] = {
    ("paddle.nn.functional.sdpa", "scaled_dot_product_attention"): "scaled_dot_product_attention",
    ("paddle.nn.functional.flash_attention", "flash_attention"): "flash_attention",
}

_ATTENTION_NAMES = tuple(sorted({attr for _, attr in ATTENTION_FUNCTIONS}))

# canonical name -> the op type Paddle's AMP lists use (the fluid name: TransToFluidOpName in Paddle's C++).
_AMP_TYPE = {
    "add": "elementwise_add",
    "subtract": "elementwise_sub",
    "mul": "elementwise_mul",
    "divide": "elementwise_div",
    "maximum": "elementwise_max",
    "minimum": "elementwise_min",
    "matmul": "matmul_v2",
    "linear": "linear_v2",  # the CUDA build's F.linear calls _C_ops.linear_v2 (white-listed)
    "sum": "reduce_sum",
    "mean": "reduce_mean",
    "prod": "reduce_prod",
    "max": "reduce_max",
    "min": "reduce_min",
    "interpolate": "nearest_interp_v2",  # every *_interp_v2 is on the same (extra black) list
    "cross_entropy_with_softmax": "softmax_with_cross_entropy",
    "neg": "scale",
    "slice": "slice",
    "reshape": "reshape2",
    "transpose": "transpose2",
    "squeeze": "squeeze2",
    "unsqueeze": "unsqueeze2",
    "flatten": "flatten_contiguous_range",
    "scaled_dot_product_attention": "flash_attn",
    "flash_attention": "flash_attn",
    "rnn_input_matmul": "rnn",  # the tracer's node for the fused rnn kernel's input GEMM: the kernel's precision
}

# Tensor dunder -> canonical op (None: depends on the operands, see _dunder_op).
_DUNDERS = {
    "__add__": "add",
    "__radd__": "add",
    "__sub__": "subtract",
    "__rsub__": "subtract",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__truediv__": "divide",
    "__rtruediv__": "divide",
    "__div__": "divide",
    "__rdiv__": "divide",
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__neg__": "neg",
    "__pow__": None,
    "__rpow__": "elementwise_pow",
    "__getitem__": "slice",
}


def amp_op_type(op: str) -> str:
    """The op type Paddle's AMP white/black lists use for a canonical op name (``add`` -> ``elementwise_add``,
    ``matmul`` -> ``matmul_v2``, ``sum`` -> ``reduce_sum``); names that Paddle spells the same pass through."""
    return _AMP_TYPE.get(op, op)


class OpMode:
    """Base class of an interception mode. Override ``__call__``; run the op with ``func(*args, **kwargs)``
    (which passes it through the modes below this one, then to Paddle)."""

    def __call__(self, op: str, func, args: tuple, kwargs: dict):
        return func(*args, **kwargs)


class _State(threading.local):
    def __init__(self):
        self.busy = 0  # >0 while a mode handles an op: nested ops are not intercepted
        self.fp32 = 0  # fp32_region depth
        self.modules: list[str] = []


_local = _State()
_modes: list[OpMode] = []
_installed = AttrPatches("ampsafe.paddle.intercept")  # the wrappers in place (core.ledger: put back exactly)
_lock = threading.RLock()


def active_modes() -> tuple[OpMode, ...]:
    """The modes currently pushed, innermost last."""
    return tuple(_modes)


def _dispatch(index: int, op: str, orig, args, kwargs):
    if index < 0:
        return orig(*args, **kwargs)
    mode = _modes[index]

    def func(*a, **k):
        return _dispatch(index - 1, op, orig, a, k)

    return mode(op, func, args, kwargs)


def _intercepted(op_of, orig):
    def wrapper(*args, **kwargs):
        state = _local
        if state.busy or not _modes:
            return orig(*args, **kwargs)
        op = op_of if isinstance(op_of, str) else op_of(args)
        state.busy += 1
        try:
            return _dispatch(len(_modes) - 1, op, orig, args, kwargs)
        finally:
            state.busy -= 1

    wrapper.__wrapped__ = orig
    wrapper.__name__ = getattr(orig, "__name__", "op")
    wrapper._ampsafe_intercept = True
    return wrapper


def _pow_op(args) -> str:
    return "elementwise_pow" if len(args) > 1 and isinstance(args[1], paddle.Tensor) else "pow"


def _bindings() -> list[tuple[object, str, object, str]]:
    """Every place the intercepted callables are bound: (namespace, attribute, original, canonical op)."""
    ops = paddle._C_ops
    by_id: dict[int, str] = {}
    found = []
    for kernel, op in KERNEL_OPS.items():
        fn = getattr(ops, kernel, None)
        if fn is None or getattr(fn, "_ampsafe_intercept", False):
            continue
        by_id[id(fn)] = op
        found.append((ops, kernel, fn, op))
    attention: dict[int, str] = {}
    for (module_name, attr), op in ATTENTION_FUNCTIONS.items():
        fn = getattr(sys.modules.get(module_name) or _import(module_name), attr, None)
        if fn is not None and not getattr(fn, "_ampsafe_intercept", False):
            by_id[id(fn)] = attention[id(fn)] = op  # found below in its own module and where paddle re-exports it
    # functions paddle re-exports by identity (paddle.exp is _C_ops.exp, F.sigmoid is _C_ops.sigmoid, ...)
    for name, module in list(sys.modules.items()):
        if module is None or module is ops:
            continue
        if not (name == "paddle" or name.startswith("paddle.")):
            # user code that imported an attention function by its own name (PaddleNLP, PaddleOCR, scripts)
            namespace = getattr(module, "__dict__", None) or {}
            for attr in _ATTENTION_NAMES:
                value = namespace.get(attr)
                if value is not None and id(value) in attention:
                    found.append((module, attr, value, attention[id(value)]))
            continue
        if "libpaddle" in name or "_pir_ops" in name:
            continue
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for attr, value in list(namespace.items()):
            op = by_id.get(id(value))
            if op is not None:
                found.append((module, attr, value, op))
    legacy = getattr(paddle, "_legacy_C_ops", None)
    for kernel, op in LEGACY_ACTIVATIONS.items():
        fn = getattr(legacy, kernel, None)
        if fn is not None and not getattr(fn, "_ampsafe_intercept", False):
            found.append((legacy, kernel, fn, op))
    tensor_dict = vars(paddle.Tensor)
    for attr, value in list(tensor_dict.items()):
        op = by_id.get(id(value))
        if op is not None:
            found.append((paddle.Tensor, attr, value, op))
    for attr, op in _DUNDERS.items():
        value = getattr(paddle.Tensor, attr, None)
        if value is not None:
            found.append((paddle.Tensor, attr, value, op if op is not None else _pow_op))
    return found


def _import(name: str):
    """The module ``name``, or None where this Paddle has no such module."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _install() -> None:
    seen = set()
    for namespace, attr, orig, op in _bindings():
        if (id(namespace), attr) in seen:
            continue
        seen.add((id(namespace), attr))
        _installed.set(namespace, attr, _intercepted(op, orig))


def _uninstall() -> None:
    _installed.restore()


@contextlib.contextmanager
def op_mode(mode: OpMode) -> Iterator[OpMode]:
    """Push ``mode`` for the duration of the block; the first entry installs the wrappers, the last exit
    removes them (also on an exception). Modes compose: the innermost sees an op first."""
    if not isinstance(mode, OpMode):
        from ..errors import AmpSafeError

        raise AmpSafeError(f"op_mode expects an ampsafe.paddle.intercept.OpMode instance, got {type(mode).__name__}")
    with _lock:
        if not _modes:
            _install()
        _modes.append(mode)
    try:
        yield mode
    finally:
        with _lock:
            # remove this mode even if an inner mode leaked (exception between enter and exit)
            for i in range(len(_modes) - 1, -1, -1):
                if _modes[i] is mode:
                    del _modes[i]
                    break
            if not _modes:
                _uninstall()


# ----------------------------------------------------------------------------------------------- modules
@contextlib.contextmanager
def module_stack(paths: dict) -> Iterator[None]:
    """Track which sublayer's forward is running (forward pre/post hooks on every sublayer), so that
    :func:`current_module` names the owner of each op by its path in ``paths``, the model's sublayers as its
    Backend's ``modules(model)`` maps them (root: ``""``)."""
    handles = []
    stack = _local.modules
    depth = len(stack)

    def push(path):
        def pre(layer, inputs):
            _local.modules.append(path)

        return pre

    def pop(layer, inputs, outputs):
        if _local.modules:
            _local.modules.pop()

    try:
        for path, layer in paths.items():
            handles.append(layer.register_forward_pre_hook(push(path)))
            handles.append(layer.register_forward_post_hook(pop))
        yield
    finally:
        for handle in handles:
            handle.remove()
        del _local.modules[depth:]  # an exception inside a forward skips its post hooks


def current_module() -> str:
    """Path of the innermost sublayer whose forward is running ("" at the root or outside any forward)."""
    stack = _local.modules
    return stack[-1] if stack else ""


# ------------------------------------------------------------------------------------------- fp32 islands
@contextlib.contextmanager
def fp32_region() -> Iterator[None]:
    """Mark code as an FP32 island: emulators and tracers must treat ops inside as float32."""
    _local.fp32 += 1
    try:
        yield
    finally:
        _local.fp32 -= 1


def in_fp32_region() -> bool:
    """True inside :func:`fp32_region` (this thread)."""
    return _local.fp32 > 0
