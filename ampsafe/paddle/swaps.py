"""PaddlePaddle's ``backend.swaps`` (:class:`~ampsafe.core.swaps.Swaps`): what the patch policies need to know
about Paddle layers, and the mixins only Paddle can write.

- :class:`FP32Island`: ``forward`` under ``paddle.amp.auto_cast(enable=False)`` and
  ``ampsafe.paddle.intercept.fp32_region()`` (so ``ampsafe.paddle.emulate_fp16`` leaves it in float32 too),
  floating inputs cast to float32. Under O2 pass ``ampsafe.patching.island_layers(model)`` as
  ``paddle.amp.decorate(..., excluded_layers=...)`` so island weights stay float32.
- :class:`RescaledNorm`: a normalization compensating an input rescaled by 2^-k (``policies.rescale``).
- :meth:`PaddleSwaps.new_batch_norm`: the ``BatchNorm{1,2,3}D`` that ``policies.convbn`` puts after a conv
  (PaddleOCR ``ConvBNLayer`` semantics; new keys ``<conv>.bn.weight/bias/_mean/_variance``).
"""

from __future__ import annotations

import paddle
from paddle import nn

from ..core.swaps import SwapMixin, SwapsBase
from .intercept import fp32_region as _fp32_region
from .tensors import LOW_DTYPES

__all__ = ["FP32Island", "RescaledNorm", "PaddleSwaps"]


def _to_float32(x):
    if isinstance(x, paddle.Tensor):
        return x.astype("float32") if x.dtype in LOW_DTYPES else x
    if isinstance(x, (list, tuple)):
        return type(x)(_to_float32(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_float32(v) for k, v in x.items()}
    return x


class FP32Island(SwapMixin):
    """The layer computes in float32 whatever auto_cast (or the float16 emulator) says."""

    _ampsafe_protection = "island"

    def forward(self, *args, **kwargs):
        with paddle.amp.auto_cast(enable=False), _fp32_region():
            return self._ampsafe_base.forward(self, *_to_float32(args), **_to_float32(kwargs))


def _stat_dict(layer, name):
    for d in (layer._parameters, layer._buffers):
        if d.get(name) is not None:
            return d
    return None


class RescaledNorm(SwapMixin):
    """A normalization whose input carries a factor s: ``_mean`` x s, ``_variance`` x s^2 and ``_epsilon`` x s^2
    for the duration of the forward (updated statistics divided back), so stored values stay in upstream units."""

    _ampsafe_protection = "rescale"
    _ampsafe_attrs = ("_ampsafe_scale",)

    def forward(self, x, *args, **kwargs):
        s = self._ampsafe_scale
        eps = self._epsilon
        powers = {"_mean": s, "_variance": s * s}
        saved = {}
        for name, power in powers.items():
            d = _stat_dict(self, name)
            if d is not None:
                saved[name] = (d, d[name], d[name] * power)
        for name, (d, _, scaled) in saved.items():
            d[name] = scaled
        self._epsilon = eps * s * s
        try:
            return self._ampsafe_base.forward(self, x, *args, **kwargs)
        finally:
            self._epsilon = eps
            for name, (d, orig, scaled) in saved.items():
                d[name] = orig
                if self.training:
                    with paddle.no_grad():
                        orig.set_value(scaled / powers[name])


_CONVS = (nn.Conv1D, nn.Conv2D, nn.Conv3D, nn.Conv1DTranspose, nn.Conv2DTranspose, nn.Conv3DTranspose)
_BN = {1: nn.BatchNorm1D, 2: nn.BatchNorm2D, 3: nn.BatchNorm3D}
_NORMS = (nn.layer.norm._BatchNormBase, nn.BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2D)


class PaddleSwaps(SwapsBase):
    """What the framework-neutral policies need to know about Paddle layers (``backend.swaps``)."""

    convs = _CONVS
    norms = _NORMS
    eps_attr = "_epsilon"
    island = FP32Island
    rescaled_norm = RescaledNorm
    optimizer_type = paddle.optimizer.Optimizer
    activations = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hardswish": nn.Hardswish, "silu": nn.Silu, "gelu": nn.GELU}
    module_label = "a paddle.nn.Layer"

    def is_distributed(self, model) -> bool:
        return type(model).__name__ == "DataParallel" and hasattr(model, "_layers")

    def new_batch_norm(self, conv) -> nn.Layer:
        """A fresh ``BatchNorm{1,2,3}D`` for the conv's output (its data format), in its train mode."""
        dims = len(conv.weight.shape) - 2
        channels = conv._out_channels
        fmt = getattr(conv, "_data_format", None) or "NCHW"
        bn = _BN[dims](channels, data_format=fmt) if dims == 2 else _BN[dims](channels)
        bn.train() if conv.training else bn.eval()
        return bn
