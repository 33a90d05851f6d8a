"""Float16 AMP for Paddle on a CPU, by emulation.

Paddle has no float16 CPU kernels, so this runs every op in float32 and reproduces float16 *storage*: for each
op that Paddle's AMP would run in float16 (decided per op exactly as Paddle does, see ``amp_lists``), its
floating inputs, weights and outputs are rounded through float16 (|x| > 65504 becomes inf) and the gradient
that flows back through each of them is rounded through float16 too. Accumulation stays float32, as in
cuDNN/cuBLAS. A tensor remembers that it is "float16" (an op output), so Paddle's promotion rule for gray
ops (float16 only when no input is float32) follows the real dtype flow. Under O2, parameters that
``paddle.amp.decorate`` would cast (``need_keep_fp32`` decides, read from Paddle) are float16: rounded at
every use. Ops inside :func:`ampsafe.paddle.intercept.fp32_region` (FP32 islands) are left alone, and so are ops
inside :func:`paused` (a scan's float32 recording, which is no island).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import paddle
from paddle.autograd import PyLayer

from ..core.model import unwrap
from ..errors import ConfigError, UnsupportedModelError
from .amp_lists import black_ops, check_level, white_ops
from .intercept import OpMode, amp_op_type, in_fp32_region, op_mode

__all__ = ["emulate_fp16", "Fp16Emulator", "round_fp16", "paused"]

_MARK = "_ampsafe_fp16"
# Paddle's GetPromoteType looks at X only for these; only their first output (Y) is a float16 tensor.
_X_ONLY = frozenset({"batch_norm", "layer_norm", "sync_batch_norm"})
# ops whose forward and backward move values without arithmetic: no re-rounding needed at their outputs.
_EXACT = frozenset(
    "reshape transpose flatten squeeze unsqueeze slice strided_slice concat stack split split_with_num unbind "
    "pad pad3d flip roll".split()
)


class _Paused(threading.local):
    depth = 0


_paused = _Paused()


@contextlib.contextmanager
def paused():
    """Ops inside (this thread) run in plain float32: every emulator leaves them alone, yet they are no FP32 island.

    Why: the scan records a float32 forward and predicts float16 per op from the level it is given
    (:mod:`ampsafe.paddle.trace`); an open emulation would put its rounding (an inf past 65504) into the values
    the scan measures, while :func:`~ampsafe.paddle.intercept.fp32_region` would tell the tracer the ops run in
    float32.
    """
    _paused.depth += 1
    try:
        yield
    finally:
        _paused.depth -= 1


def round_fp16(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` rounded through float16 and back to float32 (no autograd rounding)."""
    return x.astype("float16").astype("float32")


class _ThroughFP16(PyLayer):
    """Identity in float16 storage: rounds the value forward and the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return round_fp16(x)

    @staticmethod
    def backward(ctx, grad):
        return round_fp16(grad)


def _through_fp16(x: paddle.Tensor) -> paddle.Tensor:
    return round_fp16(x) if x.stop_gradient else _ThroughFP16.apply(x)


# Unary ops whose backward reads their saved *output*: on a GPU that output is the float16 one, so an exp
# that overflowed to inf makes its gradient 0 * inf = NaN even when the forward loss stays finite (DBHead's
# step function under O2). d(input) as a function of (d(output), output):
_OUTPUT_GRADS = {
    "exp": lambda g, y: g * y,
    "reciprocal": lambda g, y: -g * y * y,
    "sigmoid": lambda g, y: g * y * (1.0 - y),
    "tanh": lambda g, y: g * (1.0 - y * y),
    "sqrt": lambda g, y: g * 0.5 / y,
}


class _Fp16SavedOutput(PyLayer):
    """A unary op computed in float32 whose output is stored, saved for backward, and differentiated in float16."""

    @staticmethod
    def forward(ctx, x, func, op):
        y = round_fp16(func(x))
        ctx.save_for_backward(y)
        ctx.op = op
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensor()
        return round_fp16(_OUTPUT_GRADS[ctx.op](round_fp16(grad), y))


def _is_f32(value) -> bool:
    return isinstance(value, paddle.Tensor) and value.dtype == paddle.float32


class Fp16Emulator(OpMode):
    """The interception mode behind :func:`emulate_fp16`; also the object the context returns.

    ``emulated``: canonical names of the ops that ran in float16; ``counts``: how often each did;
    ``fp32_ops``: intercepted float ops that ran in float32 (black list, promotion, or FP32 island).
    """

    def __init__(
        self,
        model,
        level: str = "O1",
        dtype: str = "float16",
        *,
        use_promote: bool = True,
        custom_white_list=None,
        custom_black_list=None,
    ):
        self.level = check_level(level, dtype)
        # auto_cast(use_promote=False) (O2 only) is Paddle 2.4's O2: every op off the black list in float16
        self.promote = bool(use_promote) or self.level != "O2"
        self.dtype = dtype
        self.model = model
        self.white, self.black = _custom_lists(self.level, dtype, custom_white_list, custom_black_list)
        self.emulated: set[str] = set()
        self.fp32_ops: set[str] = set()
        self.counts: Counter[str] = Counter()
        self._token = object()  # marks tensors that are float16 in this emulation (and no other)
        self._fp16_params: dict[int, paddle.Tensor] = _decorated_params(model, dtype) if self.level == "O2" else {}
        self._stack = None

    # ---------------------------------------------------------------- dtype bookkeeping
    def is_fp16(self, tensor) -> bool:
        """Whether ``tensor`` is float16 in the emulated run (an fp16 op's output, or an O2-cast parameter)."""
        return getattr(tensor, _MARK, None) is self._token or id(tensor) in self._fp16_params

    def _mark(self, tensor):
        setattr(tensor, _MARK, self._token)
        return tensor

    def _to_fp16(self, value):
        """Input cast of an fp16 op: float32 tensors and fp16 parameters pass through float16."""
        if not _is_f32(value) or getattr(value, _MARK, None) is self._token:
            return value
        return _through_fp16(value)

    def _param_value(self, value):
        """In an fp32 op, an O2-cast parameter still holds float16 values."""
        if _is_f32(value) and id(value) in self._fp16_params:
            return _through_fp16(value)
        return value

    # ---------------------------------------------------------------- the op
    def __call__(self, op, func, args, kwargs):
        if in_fp32_region() or _paused.depth:
            return func(*args, **kwargs)
        floats = [v for v in _flat(args, kwargs) if _is_f32(v)]
        if not floats:
            return func(*args, **kwargs)
        kind = amp_op_type(op)
        if kind in self.white:
            fp16 = True
        elif kind in self.black:
            fp16 = False
        elif not self.promote:
            fp16 = True
        elif op in _X_ONLY:
            fp16 = self.is_fp16(floats[0])
        else:
            fp16 = all(self.is_fp16(v) for v in floats)
        if not fp16:
            self.fp32_ops.add(op)
            if self._fp16_params:
                args, kwargs = _map(args, kwargs, self._param_value)
            return func(*args, **kwargs)
        if op in _OUTPUT_GRADS and len(floats) == 1 and args and args[0] is floats[0] and not kwargs.get("out"):
            x = self._to_fp16(args[0])
            if not x.stop_gradient:
                self.emulated.add(op)
                self.counts[op] += 1
                extra = args[1:]
                return self._mark(_Fp16SavedOutput.apply(x, lambda v: func(v, *extra, **kwargs), op))
        if op in _X_ONLY:
            args = (self._to_fp16(args[0]),) + tuple(args[1:]) if args else args
        else:
            args, kwargs = _map(args, kwargs, self._to_fp16)
        out = func(*args, **kwargs)
        self.emulated.add(op)
        self.counts[op] += 1
        return self._outputs(op, out)

    def _outputs(self, op, out):
        exact = op in _EXACT

        def store(value):
            if not _is_f32(value):
                return value
            return self._mark(value if exact else _through_fp16(value))

        if isinstance(out, (list, tuple)):
            if op in _X_ONLY:
                return type(out)([store(out[0]), *out[1:]])
            return type(out)(store(v) for v in out)
        return store(out)

    # ---------------------------------------------------------------- context
    def report(self) -> dict:
        """What ran in float16 and in float32, by canonical op name."""
        return {
            "level": self.level,
            "emulated": sorted(self.emulated),
            "fp32": sorted(self.fp32_ops - self.emulated),
            "counts": dict(self.counts),
            "fp16_params": len(self._fp16_params),
        }

    def __enter__(self) -> Fp16Emulator:
        self._stack = op_mode(self)
        self._stack.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)


def _custom_lists(level: str, dtype: str, custom_white, custom_black) -> tuple[frozenset[str], frozenset[str]]:
    """Paddle's lists at ``level`` with ``auto_cast``'s custom lists applied as Paddle's ``_update_list`` does:
    a custom white op leaves the black list, a custom black op leaves the white list; both at once is an error."""
    white, black = set(white_ops(level, dtype)), set(black_ops(level, dtype))
    custom_white, custom_black = set(custom_white or ()), set(custom_black or ())
    both = custom_white & custom_black
    if both:
        raise ConfigError(f"custom_white_list and custom_black_list both name {sorted(both)}")
    white, black = (white | custom_white) - custom_black, (black | custom_black) - custom_white
    return frozenset(white), frozenset(black)


def _decorated_params(model, dtype: str) -> dict[int, paddle.Tensor]:
    """Parameters ``paddle.amp.decorate(level='O2')`` would cast to ``dtype`` (Paddle's own need_keep_fp32)."""
    from paddle.amp.auto_cast import need_keep_fp32

    params = {}
    for layer in model.sublayers(include_self=True):
        if need_keep_fp32(layer, dtype):
            continue
        for param in layer.parameters(include_sublayers=False):
            if param.dtype == paddle.float32:
                params[id(param)] = param
    return params


def _flat(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _map(args, kwargs, fn):
    def one(value):
        if isinstance(value, (list, tuple)):
            return type(value)(fn(v) for v in value)
        return fn(value)

    return tuple(one(v) for v in args), {k: one(v) for k, v in kwargs.items()}


def emulate_fp16(
    model, *, level: str = "O1", use_promote: bool = True, custom_white_list=None, custom_black_list=None
) -> Fp16Emulator:
    """Context manager: run ``model`` (and everything else inside the block) as Paddle float16 AMP would on a GPU.

    Example::

        with ampsafe.paddle.emulate_fp16(model, level="O2") as emu:
            loss = loss_fn(model(x))
            (loss * scale).backward()
        emu.emulated   # {'conv2d', 'batch_norm', 'relu', 'exp', ...}

    ``level``: ``"O1"`` (``auto_cast`` lists) or ``"O2"`` (``decorate`` + ``auto_cast(level='O2')``).
    ``use_promote``: as ``paddle.amp.auto_cast``'s (O2 only): False gives Paddle 2.4's O2 (the seed's 2.4.2),
    where every op off the O2 black list runs in float16 even with float32 inputs (labels, constants); 2.4's O2
    list (``PURE_FP16_BLACK_LIST``: interpolation, lookup_table, scatter) is the same ops as 3.3.1's. At both,
    ``exp``/``reciprocal``/``sigmoid`` are off the O2 list: with float16 inputs they run in float16.
    ``custom_white_list`` / ``custom_black_list``: as ``paddle.amp.auto_cast``'s (Paddle op types such as
    ``"conv2d"``, ``"elementwise_add"``, ``"exp"``): added to Paddle's white / black list at ``level``.
    An emulation: it reproduces float16 overflow and rounding, not float16 speed.
    """
    inner = unwrap(model)
    if not isinstance(inner, paddle.nn.Layer):
        raise UnsupportedModelError(
            f"emulate_fp16 needs a paddle.nn.Layer, got {type(model).__module__}.{type(model).__name__}; "
            "for torch models use torch.autocast"
        )
    return Fp16Emulator(
        inner,
        level,
        use_promote=use_promote,
        custom_white_list=custom_white_list,
        custom_black_list=custom_black_list,
    )
