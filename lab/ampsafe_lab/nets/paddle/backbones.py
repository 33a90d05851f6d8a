"""Detection backbones with PaddleOCR's layer names: MobileNetV3 (large/small, ``scale``) and ResNet_vd.

Names and numerics follow PaddleOCR's det_mobilenet_v3 / det_resnet_vd, so PaddleOCR state_dicts load
strictly: the MobileNetV3 stages are ``stage0..3`` (a new stage starts at every stride-2 block after the
stem blocks), ResNet_vd blocks are ``bb_<stage>_<block>``.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from ampsafe.paddle.nets.paddleocr_necks import SqueezeExcite

__all__ = ["make_divisible", "MobileNetV3", "ResNet_vd", "ConvBNAct"]

# (kernel, expansion, out, squeeze-excite, activation, stride) per inverted-residual block
_MNV3_LARGE = [
    (3, 16, 16, False, "relu", 1),
    (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1),
    (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hardswish", 2),
    (3, 200, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 480, 112, True, "hardswish", 1),
    (3, 672, 112, True, "hardswish", 1),
    (5, 672, 160, True, "hardswish", 2),
    (5, 960, 160, True, "hardswish", 1),
    (5, 960, 160, True, "hardswish", 1),
]
_MNV3_SMALL = [
    (3, 16, 16, True, "relu", 2),
    (3, 72, 24, False, "relu", 2),
    (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hardswish", 2),
    (5, 240, 40, True, "hardswish", 1),
    (5, 240, 40, True, "hardswish", 1),
    (5, 120, 48, True, "hardswish", 1),
    (5, 144, 48, True, "hardswish", 1),
    (5, 288, 96, True, "hardswish", 2),
    (5, 576, 96, True, "hardswish", 1),
    (5, 576, 96, True, "hardswish", 1),
]
# model_name -> (blocks, channels of the last 1x1 conv, index after which a stride-2 block opens a new stage)
_MNV3 = {"large": (_MNV3_LARGE, 960, 2), "small": (_MNV3_SMALL, 576, 0)}
_MNV3_SCALES = (0.35, 0.5, 0.75, 1.0, 1.25)


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round a channel count to the nearest multiple of ``divisor``, never dropping more than 10%."""
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def _activate(x, act: str | None):
    if act is None:
        return x
    if act == "relu":
        return F.relu(x)
    if act == "hardswish":
        return F.hardswish(x)
    raise ValueError(f"unknown activation {act!r}")


class ConvBNAct(nn.Layer):
    """Bias-free conv, BatchNorm, optional activation (MobileNetV3's ``conv`` / ``bn`` pair)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, groups=1, act=None):
        super().__init__()
        self.act = act
        self.conv = nn.Conv2D(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias_attr=False
        )
        self.bn = nn.BatchNorm2D(out_channels)

    def forward(self, x):
        return _activate(self.bn(self.conv(x)), self.act)


class InvertedResidual(nn.Layer):
    """1x1 expand, depthwise kxk (stride), optional SE, 1x1 linear projection; identity add when shapes match."""

    def __init__(self, in_channels, mid_channels, out_channels, kernel_size, stride, use_se, act):
        super().__init__()
        self.use_shortcut = stride == 1 and in_channels == out_channels
        self.use_se = use_se
        self.expand_conv = ConvBNAct(in_channels, mid_channels, 1, act=act)
        self.bottleneck_conv = ConvBNAct(
            mid_channels, mid_channels, kernel_size, stride, (kernel_size - 1) // 2, groups=mid_channels, act=act
        )
        if use_se:
            self.mid_se = SqueezeExcite(mid_channels, slope=0.1666667)
        self.linear_conv = ConvBNAct(mid_channels, out_channels, 1, act=None)

    def forward(self, inputs):
        x = self.bottleneck_conv(self.expand_conv(inputs))
        if self.use_se:
            x = self.mid_se(x)
        x = self.linear_conv(x)
        return paddle.add(inputs, x) if self.use_shortcut else x


class MobileNetV3(nn.Layer):
    """PaddleOCR's detection MobileNetV3: four feature maps at strides 4, 8, 16, 32 (``out_channels``)."""

    def __init__(self, in_channels=3, model_name="large", scale=0.5, disable_se=False, **_ignored):
        super().__init__()
        if model_name not in _MNV3:
            raise ValueError(f"MobileNetV3 model_name must be one of {sorted(_MNV3)}, got {model_name!r}")
        if scale not in _MNV3_SCALES:
            raise ValueError(f"MobileNetV3 scale must be one of {_MNV3_SCALES}, got {scale!r}")
        blocks, last_channels, stem_blocks = _MNV3[model_name]
        width = make_divisible(16 * scale)
        self.conv = ConvBNAct(in_channels, width, 3, stride=2, padding=1, act="hardswish")
        stages, current, self.out_channels = [], [], []
        for index, (k, exp, out, se, act, stride) in enumerate(blocks):
            if stride == 2 and index > stem_blocks:
                stages.append(current)
                self.out_channels.append(width)
                current = []
            out_width = make_divisible(scale * out)
            current.append(
                InvertedResidual(width, make_divisible(scale * exp), out_width, k, stride, se and not disable_se, act)
            )
            width = out_width
        last = make_divisible(scale * last_channels)
        current.append(ConvBNAct(width, last, 1, act="hardswish"))
        stages.append(current)
        self.out_channels.append(last)
        self.stages = [nn.Sequential(*layers) for layers in stages]
        for index, stage in enumerate(self.stages):
            self.add_sublayer(f"stage{index}", stage)

    def forward(self, x):
        x = self.conv(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class VdConvBN(nn.Layer):
    """ResNet_vd's conv unit: optional 2x2 avg-pool first ("vd" shortcut), bias-free conv, BatchNorm, act."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, is_vd_mode=False, act=None):
        super().__init__()
        self.is_vd_mode = is_vd_mode
        self.act = act
        self._pool2d_avg = nn.AvgPool2D(kernel_size=2, stride=2, padding=0, ceil_mode=True)
        self._conv = nn.Conv2D(
            in_channels, out_channels, kernel_size, stride=stride, padding=(kernel_size - 1) // 2, bias_attr=False
        )
        self._batch_norm = nn.BatchNorm2D(out_channels)

    def forward(self, x):
        if self.is_vd_mode:
            x = self._pool2d_avg(x)
        return _activate(self._batch_norm(self._conv(x)), self.act)


class BasicBlock(nn.Layer):
    def __init__(self, in_channels, out_channels, stride, shortcut=True, if_first=False):
        super().__init__()
        self.conv0 = VdConvBN(in_channels, out_channels, 3, stride=stride, act="relu")
        self.conv1 = VdConvBN(out_channels, out_channels, 3, act=None)
        self.shortcut = shortcut
        if not shortcut:
            self.short = VdConvBN(in_channels, out_channels, 1, is_vd_mode=not if_first)

    def forward(self, x):
        y = self.conv1(self.conv0(x))
        return F.relu(paddle.add(x if self.shortcut else self.short(x), y))


class BottleneckBlock(nn.Layer):
    expansion = 4

    def __init__(self, in_channels, out_channels, stride, shortcut=True, if_first=False):
        super().__init__()
        self.conv0 = VdConvBN(in_channels, out_channels, 1, act="relu")
        self.conv1 = VdConvBN(out_channels, out_channels, 3, stride=stride, act="relu")
        self.conv2 = VdConvBN(out_channels, out_channels * 4, 1, act=None)
        self.shortcut = shortcut
        if not shortcut:
            self.short = VdConvBN(in_channels, out_channels * 4, 1, is_vd_mode=not if_first)

    def forward(self, x):
        y = self.conv2(self.conv1(self.conv0(x)))
        return F.relu(paddle.add(x if self.shortcut else self.short(x), y))


_RESNET_DEPTHS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}


class ResNet_vd(nn.Layer):
    """PaddleOCR's det_resnet_vd (deep stem of three 3x3 convs, avg-pool shortcuts); deformable convs unsupported."""

    def __init__(self, in_channels=3, layers=50, dcn_stage=None, out_indices=None, **_ignored):
        super().__init__()
        if layers not in _RESNET_DEPTHS:
            raise ValueError(f"ResNet_vd layers must be one of {sorted(_RESNET_DEPTHS)}, got {layers!r}")
        if dcn_stage and any(dcn_stage):
            raise ValueError("ResNet_vd with deformable convs (dcn_stage) is not supported by this rebuild")
        self.out_indices = list(out_indices) if out_indices is not None else [0, 1, 2, 3]
        bottleneck = layers >= 50
        block_cls = BottleneckBlock if bottleneck else BasicBlock
        expansion = 4 if bottleneck else 1
        filters = [64, 128, 256, 512]
        self.conv1_1 = VdConvBN(in_channels, 32, 3, stride=2, act="relu")
        self.conv1_2 = VdConvBN(32, 32, 3, act="relu")
        self.conv1_3 = VdConvBN(32, 64, 3, act="relu")
        self.pool2d_max = nn.MaxPool2D(kernel_size=3, stride=2, padding=1)
        self.stages, self.out_channels = [], []
        width = 64
        for stage, depth in enumerate(_RESNET_DEPTHS[layers]):
            blocks = []
            for index in range(depth):
                block = block_cls(
                    width,
                    filters[stage],
                    stride=2 if index == 0 and stage != 0 else 1,
                    shortcut=index != 0,
                    if_first=stage == index == 0,
                )
                blocks.append(self.add_sublayer(f"bb_{stage}_{index}", block))
                width = filters[stage] * expansion
            self.stages.append(blocks)
            if stage in self.out_indices:
                self.out_channels.append(width)

    def forward(self, x):
        y = self.pool2d_max(self.conv1_3(self.conv1_2(self.conv1_1(x))))
        features = []
        for stage, blocks in enumerate(self.stages):
            for block in blocks:
                y = block(y)
            if stage in self.out_indices:
                features.append(y)
        return features
