"""PaddlePaddle's :class:`~ampsafe.core.backend.Tensors` (``PaddleBackend.tensors``): every Paddle tensor fact
the tracer, the watcher and the heal read, stated here once."""

from __future__ import annotations

import weakref

import paddle

from ..core.backend import TensorsBase
from ..core.graph import MASK_LIMIT
from .grads import unscale_params_

__all__ = ["PaddleTensors", "TENSORS", "FLOATS", "PADDLE_MASK_LIMIT", "LOW_DTYPES"]

LOW_DTYPES = (paddle.float16, paddle.bfloat16)  # the low-precision float dtypes AMP computes in

FLOATS = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)

# Paddle's nn.MultiHeadAttention / TransformerEncoder turn a bool or int attn_mask into ``(mask - 1) * 1e9``
# (``paddle.nn.layer.transformer._convert_attention_mask``): its -1e9 is a mask's fill value too. No value a model
# computes reaches 2**28 without having left float16's range 12 bits before.
PADDLE_MASK_LIMIT = min(MASK_LIMIT, 2.0**28)


class _WeakIds:
    """Tensor -> value, keyed by ``id()`` but checked through a weak reference, so a recycled id never aliases."""

    def __init__(self):
        self._entries: dict[int, tuple] = {}

    def get(self, t):
        entry = self._entries.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def __setitem__(self, t, value) -> None:
        key, entries = id(t), self._entries

        def forget(ref, key=key):
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(t, forget), value)


def _float32(t):
    return t if t.dtype == paddle.float32 else t.astype("float32")


class PaddleTensors(TensorsBase):
    """``paddle.Tensor``: keyed by ``id()`` behind a weak reference, versioned by ``inplace_version``; Paddle has
    no storage pointer, so data is identified by the tensor object."""

    tensor_type = paddle.Tensor

    @staticmethod
    def is_float(t) -> bool:
        return t.dtype in FLOATS

    @staticmethod
    def is_batched(t) -> bool:
        return t.size > 1

    @staticmethod
    def describe(t):
        return tuple(t.shape), str(t.dtype).replace("paddle.", "")

    id_map = _WeakIds

    @staticmethod
    def version(t) -> int:
        return t.inplace_version

    @staticmethod
    def finite(t) -> bool:
        return t.size == 0 or bool(paddle.isfinite(t).all())

    def grads_finite(self, params, loss=None) -> bool:
        """Paddle's fused ``check_finite_and_unscale`` kernel at scale 1, as its scaler checks, and the loss with it."""
        found = unscale_params_(params, paddle.ones([1], dtype="float32")).reshape([1])
        for t in self.checkable_leaves(loss):
            if t._is_initialized():
                found = paddle.logical_or(found, paddle.logical_not(paddle.isfinite(t).all()).reshape([1]))
        return not bool(found.item())

    @staticmethod
    def to_numpy(t):
        if not isinstance(t, paddle.Tensor) or t.dtype not in FLOATS:
            return None
        return t.detach().astype("float32").numpy()

    @staticmethod
    def abs_max(t):
        """Two reductions, no full-size ``|t|`` temporary."""
        return _float32(paddle.maximum(paddle.max(t), -paddle.min(t)))

    @staticmethod
    def lane_abs_max(t):
        """The fill values include Paddle's -1e9 (:data:`PADDLE_MASK_LIMIT`)."""
        t = t.detach()
        return PaddleTensors.abs_max(paddle.where(t <= -PADDLE_MASK_LIMIT, paddle.zeros_like(t), t))

    maximum = staticmethod(paddle.maximum)

    @staticmethod
    def to_floats(scalars: list) -> list[float]:
        return paddle.stack(scalars).numpy().tolist()

    no_grad = staticmethod(paddle.no_grad)

    @staticmethod
    def requires_grad(t) -> bool:
        return not t.stop_gradient

    @staticmethod
    def grad_hook(t, fn):
        """A tensor hook (not a layer backward hook: in-place ops and shared layers break those)."""
        if t.stop_gradient:
            return None
        try:
            return t.register_hook(lambda grad: fn(grad.detach()) if grad is not None else None)
        except (RuntimeError, ValueError):  # leaf tensors / tensors Paddle refuses to hook: not measured
            return None


TENSORS = PaddleTensors()
