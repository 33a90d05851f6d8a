"""DBFPN: PaddleOCR's DB neck, eight bias-free convs with no normalization after them.

That missing normalization is the point of this workload: the concat it returns is unbounded, and the head's
first conv multiplies it up past float16's range once training pushes the weights (see ``brink``).
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import ParamAttr, nn
from paddle.nn.initializer import KaimingUniform

__all__ = ["DBFPN"]


def _plain_conv(in_channels: int, out_channels: int, kernel_size: int) -> nn.Conv2D:
    return nn.Conv2D(
        in_channels,
        out_channels,
        kernel_size,
        padding=kernel_size // 2,
        weight_attr=ParamAttr(initializer=KaimingUniform()),
        bias_attr=False,
    )


def _upsample(x, factor: int):
    return F.interpolate(x, scale_factor=factor, mode="nearest")


class DBFPN(nn.Layer):
    """Top-down FPN: 1x1 lateral convs, nearest x2 upsample + add, 3x3 convs to out/4, upsample to 1/4, concat."""

    def __init__(self, in_channels, out_channels=256, use_asf=False, **_ignored):
        super().__init__()
        if use_asf:
            raise ValueError("DBFPN use_asf (DB++ attention fusion) is not supported by this rebuild")
        if len(in_channels) != 4:
            raise ValueError(f"DBFPN needs four backbone feature maps, got channels {list(in_channels)}")
        self.out_channels = out_channels
        c2, c3, c4, c5 = in_channels
        self.in2_conv = _plain_conv(c2, out_channels, 1)
        self.in3_conv = _plain_conv(c3, out_channels, 1)
        self.in4_conv = _plain_conv(c4, out_channels, 1)
        self.in5_conv = _plain_conv(c5, out_channels, 1)
        self.p5_conv = _plain_conv(out_channels, out_channels // 4, 3)
        self.p4_conv = _plain_conv(out_channels, out_channels // 4, 3)
        self.p3_conv = _plain_conv(out_channels, out_channels // 4, 3)
        self.p2_conv = _plain_conv(out_channels, out_channels // 4, 3)

    def forward(self, features):
        c2, c3, c4, c5 = features
        in5 = self.in5_conv(c5)
        in4 = self.in4_conv(c4)
        in3 = self.in3_conv(c3)
        in2 = self.in2_conv(c2)
        out4 = in4 + _upsample(in5, 2)
        out3 = in3 + _upsample(out4, 2)
        out2 = in2 + _upsample(out3, 2)
        p5 = _upsample(self.p5_conv(in5), 8)
        p4 = _upsample(self.p4_conv(out4), 4)
        p3 = _upsample(self.p3_conv(out3), 2)
        p2 = self.p2_conv(out2)
        return paddle.concat([p5, p4, p3, p2], axis=1)
