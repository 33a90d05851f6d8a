"""PaddleOCR's DB-family necks (DBFPN, RSEFPN, LKPAN) and their AMP-safe variants.

Why: in the upstream necks every conv is bias-free and *unnormalized*; their outputs are summed top-down
and fed to the head, so under float16 the activations grow with the weights until the head's first conv
overflows and the loss scale backs off to zero (the DBNet seed report). The maintainers' own fix is a
BatchNorm after each conv. The safe variants add exactly that and nothing else:

* same constructor arguments and the same attribute names as upstream, so every upstream state_dict key
  exists unchanged and an upstream checkpoint loads with only the new BatchNorm keys missing;
* the new keys (BatchNorm ``weight``, ``bias``, ``_mean``, ``_variance``):
  ``AmpSafeDBFPN``: ``in2_bn .. in5_bn``, ``p2_bn .. p5_bn`` (one per conv, eight in all);
  ``AmpSafeRSEFPN``: ``ins_conv.{i}.in_bn``, ``inp_conv.{i}.in_bn`` (after each RSE layer's conv, before its SE);
  ``AmpSafeLKPAN``: ``ins_bn.{i}``, ``inp_bn.{i}``, ``pan_head_bn.{i}``, ``pan_lat_bn.{i}``;
  with ``intracl: true`` (both), ``incl{1..4}.reduce_bn`` / ``stage7_bn`` / ``stage5_bn`` / ``stage3_bn`` (the
  IntraCL block's five-conv chain is normalized after its reduce conv and after each of its three rounds).

The normalization changes what the weights mean, so a model with a safe neck is trained from scratch (or
fine-tuned from an upstream checkpoint with the new BatchNorms learning); it is not an exact drop-in for
an already-trained upstream checkpoint at eval time.

The upstream-compatible ``RSEFPN`` / ``LKPAN`` here are written from what PaddleOCR's
``ppocr/modeling/necks/db_fpn.py`` computes (same keys, same forward), so this project can build the
PP-OCRv3/v4/v5 necks without a PaddleOCR checkout; ``DBFPN`` is also the dbnet workload's neck.

These are Paddle code, so they live in the Paddle package; :mod:`ampsafe.patches.paddleocr_necks` re-exports
them by name without importing paddle until a class is used.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import ParamAttr, nn

from ampsafe.patches import paddleocr_necks as _by_name

# the public names, listed once where ``ampsafe.patches`` reads them without importing paddle
__all__ = list(_by_name.__all__)


class SqueezeExcite(nn.Layer):
    """Channel gate: avg-pool, 1x1 (ratio 4) + relu, 1x1 + hard-sigmoid ``slope * x + 0.5`` (PaddleOCR's
    ``SEModule``, same sublayer names). ``slope``: 0.2 in PaddleOCR's RSE necks; the MobileNetV3 blocks of the
    lab's backbones use paddle's default, 0.1666667."""

    def __init__(self, channels: int, reduction: int = 4, slope: float = 0.2):
        super().__init__()
        self.slope = slope
        self.avg_pool = nn.AdaptiveAvgPool2D(1)
        self.conv1 = nn.Conv2D(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2D(channels // reduction, channels, 1)

    def forward(self, x):
        gate = F.relu(self.conv1(self.avg_pool(x)))
        gate = F.hardsigmoid(self.conv2(gate), slope=self.slope, offset=0.5)
        return x * gate


def _kaiming() -> ParamAttr:
    return ParamAttr(initializer=nn.initializer.KaimingUniform())


def _conv(cin: int, cout: int, k, *, stride: int = 1, padding=0, bias: bool = False) -> nn.Conv2D:
    return nn.Conv2D(
        cin, cout, k, stride=stride, padding=padding, weight_attr=_kaiming(), bias_attr=None if bias else False
    )


def _up(x, factor: int):
    return F.interpolate(x, scale_factor=factor, mode="nearest")


def _fuse(p5, p4, p3, p2):
    return paddle.concat([_up(p5, 8), _up(p4, 4), _up(p3, 2), p2], axis=1)


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
        self.in2_conv = _conv(c2, out_channels, 1, padding=0)
        self.in3_conv = _conv(c3, out_channels, 1, padding=0)
        self.in4_conv = _conv(c4, out_channels, 1, padding=0)
        self.in5_conv = _conv(c5, out_channels, 1, padding=0)
        self.p5_conv = _conv(out_channels, out_channels // 4, 3, padding=1)
        self.p4_conv = _conv(out_channels, out_channels // 4, 3, padding=1)
        self.p3_conv = _conv(out_channels, out_channels // 4, 3, padding=1)
        self.p2_conv = _conv(out_channels, out_channels // 4, 3, padding=1)

    def forward(self, features):
        c2, c3, c4, c5 = features
        in5 = self.in5_conv(c5)
        in4 = self.in4_conv(c4)
        in3 = self.in3_conv(c3)
        in2 = self.in2_conv(c2)
        out4 = in4 + _up(in5, 2)
        out3 = in3 + _up(out4, 2)
        out2 = in2 + _up(out3, 2)
        return _fuse(self.p5_conv(in5), self.p4_conv(out4), self.p3_conv(out3), self.p2_conv(out2))


class ASFBlock(nn.Layer):
    """DBNet++'s adaptive scale fusion: per-scale attention weights (sigmoid-bounded) over the fused maps."""

    def __init__(self, in_channels: int, inter_channels: int, out_features_num: int = 4):
        super().__init__()
        self.in_channels = in_channels
        self.inter_channels = inter_channels
        self.out_features_num = out_features_num
        self.conv = nn.Conv2D(in_channels, inter_channels, 3, padding=1)
        self.spatial_scale = nn.Sequential(
            nn.Conv2D(1, 1, 3, padding=1, bias_attr=False, weight_attr=_kaiming()),
            nn.ReLU(),
            nn.Conv2D(1, 1, 1, bias_attr=False, weight_attr=_kaiming()),
            nn.Sigmoid(),
        )
        self.channel_scale = nn.Sequential(
            nn.Conv2D(inter_channels, out_features_num, 1, bias_attr=False, weight_attr=_kaiming()), nn.Sigmoid()
        )

    def forward(self, fuse_features, features_list):
        fused = self.conv(fuse_features)
        attention = self.channel_scale(self.spatial_scale(paddle.mean(fused, axis=1, keepdim=True)) + fused)
        return paddle.concat([attention[:, i : i + 1] * f for i, f in enumerate(features_list)], axis=1)


class RSELayer(nn.Layer):
    """Conv (``in_conv``) then squeeze-excite, with an optional residual around the SE."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, shortcut: bool = True):
        super().__init__()
        self.out_channels = out_channels
        self.in_conv = _conv(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.se_block = SqueezeExcite(out_channels)
        self.shortcut = shortcut

    def _post(self, y):
        return y

    def forward(self, ins):
        x = self._post(self.in_conv(ins))
        return x + self.se_block(x) if self.shortcut else self.se_block(x)


class IntraCLBlock(nn.Layer):
    """PP-OCRv4's intra-instance collaborative learning block: reduce, three rounds of square + vertical +
    horizontal convs (7, 5, 3), expand, BatchNorm + ReLU, residual."""

    def __init__(self, in_channels: int = 96, reduce_factor: int = 4):
        super().__init__()
        self.channels = in_channels
        self.rf = reduce_factor
        mid = in_channels // reduce_factor
        self.conv1x1_reduce_channel = nn.Conv2D(in_channels, mid, 1)
        self.conv1x1_return_channel = nn.Conv2D(mid, in_channels, 1)
        for k in (7, 5, 3):
            setattr(self, f"v_layer_{k}x1", nn.Conv2D(mid, mid, (k, 1), padding=(k // 2, 0)))
            setattr(self, f"q_layer_1x{k}", nn.Conv2D(mid, mid, (1, k), padding=(0, k // 2)))
            setattr(self, f"c_layer_{k}x{k}", nn.Conv2D(mid, mid, (k, k), padding=(k // 2, k // 2)))
        self.bn = nn.BatchNorm2D(in_channels)
        self.relu = nn.ReLU()

    def _post(self, stage: str, y):
        return y

    def forward(self, x):
        y = self._post("reduce", self.conv1x1_reduce_channel(x))
        for k in (7, 5, 3):
            y = (
                getattr(self, f"c_layer_{k}x{k}")(y)
                + getattr(self, f"v_layer_{k}x1")(y)
                + getattr(self, f"q_layer_1x{k}")(y)
            )
            y = self._post(f"stage{k}", y)
        return x + self.relu(self.bn(self.conv1x1_return_channel(y)))


class _IntraCLMixin:
    """Both RSEFPN and LKPAN optionally refine each scale with an IntraCLBlock (``incl1..incl4``)."""

    intracl_cls = IntraCLBlock

    def _build_intracl(self, kwargs) -> None:
        self.intracl = kwargs.get("intracl", False) is True
        if self.intracl:
            for i in range(1, 5):
                setattr(self, f"incl{i}", self.intracl_cls(self.out_channels // 4, reduce_factor=2))

    def _intracl(self, p5, p4, p3, p2):
        if not self.intracl:
            return p5, p4, p3, p2
        return self.incl4(p5), self.incl3(p4), self.incl2(p3), self.incl1(p2)


class RSEFPN(_IntraCLMixin, nn.Layer):
    """Upstream RSEFPN (PP-OCRv3/v4/v5 mobile): DBFPN's topology with RSE layers (conv + SE) instead of plain
    convs: ``ins_conv.{i}`` (1x1, lateral) and ``inp_conv.{i}`` (3x3, to ``out_channels // 4``)."""

    layer_cls = RSELayer

    def __init__(self, in_channels, out_channels: int, shortcut: bool = True, **kwargs):
        super().__init__()
        self.out_channels = out_channels
        self.ins_conv = nn.LayerList()
        self.inp_conv = nn.LayerList()
        self._build_intracl(kwargs)
        for cin in in_channels:
            self.ins_conv.append(self.layer_cls(cin, out_channels, kernel_size=1, shortcut=shortcut))
            self.inp_conv.append(self.layer_cls(out_channels, out_channels // 4, kernel_size=3, shortcut=shortcut))

    def forward(self, x):
        c2, c3, c4, c5 = x
        in5, in4, in3, in2 = (self.ins_conv[i](c) for i, c in ((3, c5), (2, c4), (1, c3), (0, c2)))
        out4 = in4 + _up(in5, 2)
        out3 = in3 + _up(out4, 2)
        out2 = in2 + _up(out3, 2)
        p5, p4, p3, p2 = self.inp_conv[3](in5), self.inp_conv[2](out4), self.inp_conv[1](out3), self.inp_conv[0](out2)
        return _fuse(*self._intracl(p5, p4, p3, p2))


class DSConv(nn.Layer):
    """LKPAN 'lite' large-kernel conv: depthwise conv + BN, 1x1 expand x4 + BN + act, 1x1 project (+ 1x1
    shortcut when the channel count changes)."""

    def __init__(
        self, in_channels, out_channels, kernel_size, padding, stride=1, groups=None, if_act=True, act="relu", **kwargs
    ):
        super().__init__()
        if act not in ("relu", "hardswish"):
            raise ValueError(f"DSConv act must be 'relu' or 'hardswish', got {act!r}")
        self.if_act = if_act
        self.act = act
        groups = in_channels if groups is None else groups
        self.conv1 = nn.Conv2D(
            in_channels, in_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias_attr=False
        )
        self.bn1 = nn.BatchNorm(num_channels=in_channels, act=None)
        self.conv2 = nn.Conv2D(in_channels, in_channels * 4, 1, bias_attr=False)
        self.bn2 = nn.BatchNorm(num_channels=in_channels * 4, act=None)
        self.conv3 = nn.Conv2D(in_channels * 4, out_channels, 1, bias_attr=False)
        self._c = [in_channels, out_channels]
        if in_channels != out_channels:
            self.conv_end = nn.Conv2D(in_channels, out_channels, 1, bias_attr=False)

    def forward(self, inputs):
        x = self.bn2(self.conv2(self.bn1(self.conv1(inputs))))
        if self.if_act:
            x = F.relu(x) if self.act == "relu" else F.hardswish(x)
        x = self.conv3(x)
        return x + self.conv_end(inputs) if self._c[0] != self._c[1] else x


class LKPAN(_IntraCLMixin, nn.Layer):
    """Upstream LKPAN (PP-OCRv3 teacher, PP-OCRv4/v5 server): DBFPN's top-down path with 9x9 convs, then a
    bottom-up PAN path (stride-2 3x3 ``pan_head_conv``) and 9x9 ``pan_lat_conv`` outputs. No normalization
    in 'large' mode."""

    def __init__(self, in_channels, out_channels: int, mode: str = "large", **kwargs):
        super().__init__()
        self.out_channels = out_channels
        quarter = out_channels // 4
        if mode.lower() == "lite":
            p_layer = DSConv
        elif mode.lower() == "large":
            p_layer = nn.Conv2D
        else:
            raise ValueError(f"mode can only be one of ['lite', 'large'], but received {mode}")
        self.ins_conv = nn.LayerList()
        self.inp_conv = nn.LayerList()
        self.pan_head_conv = nn.LayerList()
        self.pan_lat_conv = nn.LayerList()
        big = {"kernel_size": 9, "padding": 4, "weight_attr": _kaiming(), "bias_attr": False}
        for i, cin in enumerate(in_channels):
            self.ins_conv.append(_conv(cin, out_channels, 1))
            self.inp_conv.append(p_layer(in_channels=out_channels, out_channels=quarter, **big))
            if i > 0:
                self.pan_head_conv.append(_conv(quarter, quarter, 3, stride=2, padding=1))
            self.pan_lat_conv.append(p_layer(in_channels=quarter, out_channels=quarter, **big))
        self._build_intracl(kwargs)

    def _post(self, kind: str, i: int, y):
        """Hook after each conv (``kind`` in ins/inp/pan_head/pan_lat): identity upstream, BN when safe."""
        return y

    def forward(self, x):
        c2, c3, c4, c5 = x
        in5, in4, in3, in2 = (
            self._post("ins", i, self.ins_conv[i](c)) for i, c in ((3, c5), (2, c4), (1, c3), (0, c2))
        )
        out4 = in4 + _up(in5, 2)
        out3 = in3 + _up(out4, 2)
        out2 = in2 + _up(out3, 2)
        f5, f4, f3, f2 = (
            self._post("inp", i, self.inp_conv[i](t)) for i, t in ((3, in5), (2, out4), (1, out3), (0, out2))
        )
        pan3 = f3 + self._post("pan_head", 0, self.pan_head_conv[0](f2))
        pan4 = f4 + self._post("pan_head", 1, self.pan_head_conv[1](pan3))
        pan5 = f5 + self._post("pan_head", 2, self.pan_head_conv[2](pan4))
        p2, p3, p4, p5 = (
            self._post("pan_lat", i, self.pan_lat_conv[i](t)) for i, t in enumerate((f2, pan3, pan4, pan5))
        )
        return _fuse(*self._intracl(p5, p4, p3, p2))


# --------------------------------------------------------------------------------------------- safe variants


class AmpSafeDBFPN(DBFPN):
    """DBFPN with a BatchNorm after each of its eight convs (``in{2..5}_bn``, ``p{2..5}_bn``).

    Extends the dbnet workload's DBFPN (upstream keys ``in2_conv..in5_conv``, ``p2_conv..p5_conv``), so an
    upstream checkpoint loads with only the BN keys missing. ``use_asf`` (DB++) adds upstream's ``asf`` block,
    which reads the normalized per-scale maps."""

    protection = "convbn"

    def __init__(self, in_channels, out_channels: int = 256, use_asf: bool = False, **kwargs):
        super().__init__(in_channels, out_channels, **kwargs)
        self.use_asf = use_asf
        for level in (2, 3, 4, 5):
            setattr(self, f"in{level}_bn", nn.BatchNorm2D(out_channels))
        for level in (5, 4, 3, 2):
            setattr(self, f"p{level}_bn", nn.BatchNorm2D(out_channels // 4))
        if use_asf:
            self.asf = ASFBlock(out_channels, out_channels // 4)

    def _conv_bn(self, name: str, x):
        return getattr(self, f"{name}_bn")(getattr(self, f"{name}_conv")(x))

    def forward(self, features):
        c2, c3, c4, c5 = features
        in5, in4, in3, in2 = (self._conv_bn(f"in{i}", c) for i, c in ((5, c5), (4, c4), (3, c3), (2, c2)))
        out4 = in4 + _up(in5, 2)
        out3 = in3 + _up(out4, 2)
        out2 = in2 + _up(out3, 2)
        p5, p4, p3, p2 = (self._conv_bn(f"p{i}", t) for i, t in ((5, in5), (4, out4), (3, out3), (2, out2)))
        fuse = _fuse(p5, p4, p3, p2)
        if self.use_asf:
            fuse = self.asf(fuse, [_up(p5, 8), _up(p4, 4), _up(p3, 2), p2])
        return fuse


class AmpSafeIntraCLBlock(IntraCLBlock):
    """IntraCL block whose inner chain of convs (reduce, then three rounds of square + vertical + horizontal
    convs) is normalized after the reduce and after each round: ``reduce_bn``, ``stage7_bn``, ``stage5_bn``,
    ``stage3_bn``. Upstream only normalizes at the end, after five convs in a row."""

    def __init__(self, in_channels: int = 96, reduce_factor: int = 4):
        super().__init__(in_channels, reduce_factor)
        mid = in_channels // reduce_factor
        for stage in ("reduce", "stage7", "stage5", "stage3"):
            setattr(self, f"{stage}_bn", nn.BatchNorm2D(mid))

    def _post(self, stage: str, y):
        return getattr(self, f"{stage}_bn")(y)


class AmpSafeRSELayer(RSELayer):
    """RSE layer with a BatchNorm (``in_bn``) between its conv and the SE / residual."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, shortcut: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, shortcut)
        self.in_bn = nn.BatchNorm2D(out_channels)

    def _post(self, y):
        return self.in_bn(y)


class AmpSafeRSEFPN(RSEFPN):
    """RSEFPN whose RSE layers normalize their conv output (new keys ``ins_conv.{i}.in_bn``, ``inp_conv.{i}.in_bn``)."""

    protection = "convbn"
    layer_cls = AmpSafeRSELayer
    intracl_cls = AmpSafeIntraCLBlock

    def __init__(self, in_channels, out_channels: int, shortcut: bool = True, **kwargs):
        super().__init__(in_channels, out_channels, shortcut=shortcut, **kwargs)


class AmpSafeLKPAN(LKPAN):
    """LKPAN with a BatchNorm after each conv stage (``ins_bn.{i}``, ``inp_bn.{i}``, ``pan_head_bn.{i}``,
    ``pan_lat_bn.{i}``; with ``intracl``, ``incl{1..4}.{reduce,stage7,stage5,stage3}_bn``)."""

    protection = "convbn"
    intracl_cls = AmpSafeIntraCLBlock

    def __init__(self, in_channels, out_channels: int, mode: str = "large", **kwargs):
        super().__init__(in_channels, out_channels, mode=mode, **kwargs)
        quarter = out_channels // 4
        n = len(in_channels)
        self.ins_bn = nn.LayerList([nn.BatchNorm2D(out_channels) for _ in range(n)])
        self.inp_bn = nn.LayerList([nn.BatchNorm2D(quarter) for _ in range(n)])
        self.pan_head_bn = nn.LayerList([nn.BatchNorm2D(quarter) for _ in range(n - 1)])
        self.pan_lat_bn = nn.LayerList([nn.BatchNorm2D(quarter) for _ in range(n)])

    def _post(self, kind: str, i: int, y):
        return getattr(self, f"{kind}_bn")[i](y)


# every neck above, by the name a PaddleOCR config gives it (Architecture.Neck.name): what the dbnet builder looks up
PADDLEOCR_NECKS: dict[str, type] = {
    cls.__name__: cls for cls in (DBFPN, RSEFPN, LKPAN, AmpSafeDBFPN, AmpSafeRSEFPN, AmpSafeLKPAN)
}
