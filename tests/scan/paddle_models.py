"""Small Paddle models shaped like the parts of DBNet that matter to path analysis (built here, no ppocr)."""

from __future__ import annotations

import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class ConvBNAct(nn.Layer):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv = nn.Conv2D(cin, cout, 3, stride=stride, padding=1, bias_attr=False)
        self.bn = nn.BatchNorm2D(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class SE(nn.Layer):
    """conv -> relu -> conv -> hardsigmoid, scaling its input (MobileNetV3's squeeze-excitation)."""

    def __init__(self, c):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2D(1)
        self.conv1 = nn.Conv2D(c, c // 4, 1)
        self.conv2 = nn.Conv2D(c // 4, c, 1)

    def forward(self, x):
        s = F.relu(self.conv1(self.pool(x)))
        return x * F.hardsigmoid(self.conv2(s), slope=0.2, offset=0.5)


class TinyFPN(nn.Layer):
    """DBFPN's dataflow on two levels: in-convs, upsample + add, p-convs, concat, head conv + BN."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = ConvBNAct(3, c, 2)
        self.se = SE(c)
        self.down = ConvBNAct(c, c, 2)
        self.in2_conv = nn.Conv2D(c, c, 1, bias_attr=False)
        self.in3_conv = nn.Conv2D(c, c, 1, bias_attr=False)
        self.p2_conv = nn.Conv2D(c, c // 2, 3, padding=1, bias_attr=False)
        self.p3_conv = nn.Conv2D(c, c // 2, 3, padding=1, bias_attr=False)
        self.head_conv = nn.Conv2D(c, c, 3, padding=1, bias_attr=False)
        self.head_bn = nn.BatchNorm2D(c)
        self.thresh_conv = nn.Conv2D(c, 1, 3, padding=1, bias_attr=False)
        self.thresh_bn = nn.BatchNorm2D(1)
        self.k = 50.0

    def forward(self, x):
        c2 = self.se(self.stem(x))
        c3 = self.down(c2)
        in3 = self.in3_conv(c3)
        in2 = self.in2_conv(c2)
        out2 = in2 + F.upsample(in3, scale_factor=2, mode="nearest")
        p3 = F.upsample(self.p3_conv(in3), scale_factor=2, mode="nearest")
        p2 = self.p2_conv(out2)
        fuse = paddle.concat([p2, p3], axis=1)
        y = F.sigmoid(F.relu(self.head_bn(self.head_conv(fuse))))
        t = F.sigmoid(self.thresh_bn(self.thresh_conv(fuse)))
        return paddle.reciprocal(1 + paddle.exp(-self.k * (y - t)))
