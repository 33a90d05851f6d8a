"""PyTorch's ``backend.swaps`` (:class:`~ampsafe.core.swaps.Swaps`): what the patch policies need to know about
torch modules, and the mixins only torch can write.

- :class:`FP32Island`: ``forward`` runs under ``torch.autocast(device_type, enabled=False)`` with floating
  inputs cast to float32 (a context manager inside ``forward``, never a pre/post hook pair, so an exception
  cannot leak the disabled-autocast state).
- :class:`RescaledNorm`: a normalization compensating an input rescaled by 2^-k (``policies.rescale``).
- :meth:`TorchSwaps.new_batch_norm`: the ``nn.BatchNorm{1,2,3}d`` that ``policies.convbn`` puts after a conv.

Islands are for autocast (O1). In a model cast with ``.half()`` (DeepSpeed's ``"fp16"``) or computing in float16
under FSDP2's ``param_dtype=torch.float16``, an island reads its float16 weights as float32 copies at each call;
there no autocast casts its float32 output for the next layer, whose float16 weights then meet a float32 input
("expected m1 and m2 to have the same dtype"), so an output float16 can hold goes back to float16, and one it
cannot hold stays float32 (a float32 loss or another island can still read it).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from ..core.swaps import SwapMixin, SwapsBase
from .tensors import LOW_DTYPES

__all__ = ["FP32Island", "RescaledNorm", "TorchSwaps"]

_AUTOCAST_DEVICES = {"cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia"}


def _to_float32(x):
    if isinstance(x, torch.Tensor):
        return x.float() if x.dtype in LOW_DTYPES else x
    if isinstance(x, (list, tuple)):
        out = [_to_float32(v) for v in x]
        return type(x)(out) if not hasattr(x, "_fields") else type(x)(*out)
    if isinstance(x, dict):
        return {k: _to_float32(v) for k, v in x.items()}
    return x


def _device_type(args, kwargs) -> str:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v.device.type if v.device.type in _AUTOCAST_DEVICES else "cpu"
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            return v[0].device.type if v[0].device.type in _AUTOCAST_DEVICES else "cpu"
    return "cpu"


@contextlib.contextmanager
def _float32_parameters(module):
    """A model cast to float16 (``.half()``, DeepSpeed's ``"fp16"``): its float16 parameters read as float32 copies
    during one forward (differentiable casts: the gradients reach the float16 parameters), then put back."""
    swapped = [
        (m, name, p)
        for m in module.modules()
        for name, p in m._parameters.items()
        if p is not None and p.dtype in LOW_DTYPES
    ]
    for m, name, p in swapped:
        m._parameters[name] = p.float()
    try:
        yield
    finally:
        for m, name, p in swapped:
            m._parameters[name] = p


def _low_dtype(module, args, kwargs):
    """The float16/bfloat16 dtype a model computing in low precision without autocast hands this module (its first
    such input, else its first such parameter), or None."""
    for x in list(args) + list(kwargs.values()):
        for t in x if isinstance(x, (list, tuple)) else (x,):
            if isinstance(t, torch.Tensor) and t.dtype in LOW_DTYPES:
                return t.dtype
    return next((p.dtype for p in module.parameters() if p.dtype in LOW_DTYPES), None)


def _back_if_it_fits(x, dtype):
    """``x``'s float32 tensors in ``dtype`` unless a finite value of theirs is past its range (one host sync per
    tensor; a non-finite output is non-finite either way), else as they are."""
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.float32 or not x.numel():
            return x
        amax = float(x.detach().abs().max())
        return x if math.isfinite(amax) and amax > torch.finfo(dtype).max else x.to(dtype)
    if isinstance(x, (list, tuple)):
        out = [_back_if_it_fits(v, dtype) for v in x]
        return type(x)(out) if not hasattr(x, "_fields") else type(x)(*out)
    if isinstance(x, dict):
        return type(x)({k: _back_if_it_fits(v, dtype) for k, v in x.items()}) if type(x) is dict else x
    return x


class FP32Island(SwapMixin):
    """The module computes in float32 whatever autocast says; its parameters are untouched (float16 ones, of a
    model cast to float16, are read as float32 copies during the forward). Without autocast, in a model computing
    in float16, an output float16 holds is returned in float16 (the next layer's weights are float16)."""

    _ampsafe_protection = "island"

    def forward(self, *args, **kwargs):
        device = _device_type(args, kwargs)
        low = None if torch.is_autocast_enabled(device) else _low_dtype(self, args, kwargs)
        with torch.autocast(device_type=device, enabled=False), _float32_parameters(self):
            out = self._ampsafe_base.forward(self, *_to_float32(args), **_to_float32(kwargs))
        return out if low is None else _back_if_it_fits(out, low)


class RescaledNorm(SwapMixin):
    """A normalization whose input carries a factor s: running statistics x s, s^2 and epsilon x s^2 for the
    duration of the forward (updated statistics are divided back), so stored values stay in upstream units."""

    _ampsafe_protection = "rescale"
    _ampsafe_attrs = ("_ampsafe_scale",)

    def forward(self, x, *args, **kwargs):
        s = self._ampsafe_scale
        eps = self.eps
        stats = {n: self._buffers[n] for n in ("running_mean", "running_var") if self._buffers.get(n) is not None}
        powers = {"running_mean": s, "running_var": s * s}
        scaled = {n: t * powers[n] for n, t in stats.items()}
        self._buffers.update(scaled)
        self.eps = eps * s * s
        try:
            return self._ampsafe_base.forward(self, x, *args, **kwargs)
        finally:
            self.eps = eps
            self._buffers.update(stats)
            if self.training:
                with torch.no_grad():
                    for n, t in stats.items():
                        t.copy_(scaled[n] / powers[n])


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


class TorchSwaps(SwapsBase):
    """What the framework-neutral policies need to know about torch modules (``backend.swaps``)."""

    convs = _CONVS
    norms = _NORMS
    island = FP32Island
    rescaled_norm = RescaledNorm
    optimizer_type = torch.optim.Optimizer
    activations = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hardswish": nn.Hardswish, "silu": nn.SiLU, "gelu": nn.GELU}
    module_label = "an nn.Module"

    def is_distributed(self, model) -> bool:
        return isinstance(model, nn.parallel.DistributedDataParallel)

    def new_batch_norm(self, conv) -> nn.Module:
        """A fresh ``BatchNorm{1,2,3}d`` for the conv's output, on its device and dtype, in its train mode."""
        weight = conv.weight
        bn = _BN[weight.dim() - 2](conv.out_channels, device=weight.device, dtype=weight.dtype)
        bn.train(conv.training)
        return bn
