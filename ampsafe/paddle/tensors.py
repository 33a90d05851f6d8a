"""PaddlePaddle's :class:`~ampsafe.core.backend.Tensors` (``PaddleBackend.tensors``): every Paddle tensor fact
the tracer, the watcher and the heal read, stated here once."""

from __future__ import annotations

import paddle

from ..core.backend import TensorsBase
from ..core.graph import MASK_LIMIT
from .grads import unscale_params_

__all__ = ["PaddleTensors", "TENSORS", "PADDLE_MASK_LIMIT", "LOW_DTYPES"]

LOW_DTYPES = (paddle.float16, paddle.bfloat16)  # the low-precision float dtypes AMP computes in

# Paddle's nn.MultiHeadAttention / TransformerEncoder turn a bool or int attn_mask into ``(mask - 1) * 1e9``
# (``paddle.nn.layer.transformer._convert_attention_mask``), and PaddleOCR's TableMaster head fills its masked
# scores with -6.55e4 "for fp16" (``ppocr/modeling/heads/table_master_head.py``, ``masked_fill``: an additive
# mask at float16's edge). Both are fill values: lanes at or below -2**15 count apart only where they end in a
# masked softmax, an exp or a bounded op (``ampsafe.core.paths``), which give 0 or their bound for them in float16
# as in float32; the conv or matmul that made the scores is measured whole.
PADDLE_MASK_LIMIT = min(MASK_LIMIT, 2.0**15)


class PaddleTensors(TensorsBase):
    """``paddle.Tensor``: versioned by ``inplace_version``; Paddle has no storage pointer, so data is identified by
    the tensor object (the base's ``key``). The facts ``paddle`` spells as the base reads them are the base's."""

    lib = paddle
    mask_limit = PADDLE_MASK_LIMIT  # Paddle's attention fills masked lanes with -1e9, TableMaster with -6.55e4

    @staticmethod
    def is_batched(t) -> bool:
        return t.size > 1

    @staticmethod
    def version(t) -> int:
        return t.inplace_version

    def grads_finite(self, params, loss=None) -> bool:
        """Paddle's fused ``check_finite_and_unscale`` kernel at scale 1, as its scaler checks, and the loss with it."""
        found = unscale_params_(params, paddle.ones([1], dtype="float32")).reshape([1])
        for t in self.checkable_leaves(loss):
            if t._is_initialized():
                found = paddle.logical_or(found, paddle.logical_not(paddle.isfinite(t).all()).reshape([1]))
        return not bool(found.item())

    @staticmethod
    def assign(targets: list, values: list) -> None:
        with paddle.no_grad():
            for t, value in zip(targets, values):
                t.set_value(value)

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
