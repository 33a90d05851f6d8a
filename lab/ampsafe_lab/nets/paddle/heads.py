"""DBHead: a probability branch and a threshold branch, joined by the differentiable binarization step."""

from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import ParamAttr, nn
from paddle.nn.initializer import Constant, KaimingUniform, Uniform

__all__ = ["DBHead", "DBBranch"]


def _uniform_bias(fan: int) -> ParamAttr:
    bound = 1.0 / math.sqrt(fan)
    return ParamAttr(initializer=Uniform(-bound, bound))


def _bn(channels: int) -> nn.BatchNorm2D:
    return nn.BatchNorm2D(
        channels, weight_attr=ParamAttr(initializer=Constant(1.0)), bias_attr=ParamAttr(initializer=Constant(1e-4))
    )


class DBBranch(nn.Layer):
    """3x3 conv (bias-free) + BN + relu, 2x2 stride-2 transposed conv + BN + relu, 2x2 transposed conv, sigmoid.

    ``conv1`` is the first normalization-free consumer of the DBFPN concat: the op that overflows float16.
    """

    def __init__(self, in_channels: int):
        super().__init__()
        mid = in_channels // 4
        self.conv1 = nn.Conv2D(in_channels, mid, 3, padding=1, bias_attr=False)
        self.conv_bn1 = _bn(mid)
        self.conv2 = nn.Conv2DTranspose(
            mid, mid, 2, stride=2, weight_attr=ParamAttr(initializer=KaimingUniform()), bias_attr=_uniform_bias(mid)
        )
        self.conv_bn2 = _bn(mid)
        self.conv3 = nn.Conv2DTranspose(
            mid, 1, 2, stride=2, weight_attr=ParamAttr(initializer=KaimingUniform()), bias_attr=_uniform_bias(mid)
        )

    def forward(self, x):
        x = F.relu(self.conv_bn1(self.conv1(x)))
        x = F.relu(self.conv_bn2(self.conv2(x)))
        return F.sigmoid(self.conv3(x))


class DBHead(nn.Layer):
    """Train mode: maps = [shrink, threshold, binary] (N, 3, H, W); eval mode: the shrink map only (N, 1, H, W)."""

    def __init__(self, in_channels: int, k: float = 50, **_ignored):
        super().__init__()
        self.k = k
        self.binarize = DBBranch(in_channels)
        self.thresh = DBBranch(in_channels)

    def step_function(self, x, y):
        # Written as upstream writes it: the exp here overflows float16 under O2 (ampsafe rewrites it).
        return paddle.reciprocal(1 + paddle.exp(-self.k * (x - y)))

    def forward(self, x, targets=None):
        shrink_maps = self.binarize(x)
        if not self.training:
            return {"maps": shrink_maps}
        threshold_maps = self.thresh(x)
        binary_maps = self.step_function(shrink_maps, threshold_maps)
        return {"maps": paddle.concat([shrink_maps, threshold_maps, binary_maps], axis=1)}
