"""PaddleOCR's PP-OCRv4 mobile text detector in PyTorch, module for module as PaddleOCR names it.

    model = build_det_model(arch)                 # the ``Architecture`` section of ch_PP-OCRv4_det_student.yml
    load_params(model, params)                    # the shipped tensors, {structured name: ndarray}

The same network as :mod:`ampsafe.paddle.nets.ppocrv4` (PPLCNetV3 x0.75 re-parameterized, RSEFPN 96, DBHead),
so a scan or a heal names the same paths in both frameworks: ``head.binarize.conv1``,
``neck.inp_conv.0.in_conv``, ``backbone.blocks5.2.pw_conv.reparam_conv``. Parameters carry the shipped names;
BatchNorm statistics are torch's ``running_mean`` / ``running_var`` (Paddle's ``_mean`` / ``_variance``).
Paddle's ops are matched exactly: hardswish and the backbone's hardsigmoid are torch's, the neck's squeeze-excite
gates with ``clip(0.2 x + 0.5, 0, 1)``, upsampling is nearest at integer factors, BatchNorm epsilon 1e-5.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PPLCNetV3Det", "RSEFPN", "DBHead", "DBLoss", "PPOCRv4Det", "build_det_model", "load_params", "NOT_SHIPPED"]

# stage -> (kernel, in channels, out channels, stride, squeeze-excite) at scale 1, PPLCNetV3's detection layout
_STAGES = {
    "blocks2": [(3, 16, 32, 1, False)],
    "blocks3": [(3, 32, 64, 2, False), (3, 64, 64, 1, False)],
    "blocks4": [(3, 64, 128, 2, False), (3, 128, 128, 1, False)],
    "blocks5": [(3, 128, 256, 2, False)] + [(5, 256, 256, 1, False)] * 4,
    "blocks6": [(5, 256, 512, 2, True), (5, 512, 512, 1, True), (5, 512, 512, 1, False), (5, 512, 512, 1, False)],
}
_NECK_INPUTS = (16, 24, 56, 480)
# DBHead's threshold branch only feeds the training loss: the inference export drops it, so it is not shipped
NOT_SHIPPED = ("head.thresh.",)


def _divisible16(value: float) -> int:
    rounded = max(16, int(value + 8) // 16 * 16)
    return rounded + 16 if rounded < 0.9 * value else rounded


def _scalar(value: float) -> nn.Parameter:
    return nn.Parameter(torch.full((1,), value))


class ConvBN(nn.Module):
    """Bias-free conv and BatchNorm (``conv``, ``bn``): the stem."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class LearnableHardswish(nn.Module):
    """``scale * hardswish(x) + bias`` with two learned scalars."""

    def __init__(self):
        super().__init__()
        self.scale, self.bias = _scalar(1.0), _scalar(0.0)

    def forward(self, x):
        return self.scale * F.hardswish(x) + self.bias


class RepConv(nn.Module):
    """A re-parameterized learnable rep layer: ``reparam_conv``, affine ``w``/``b``, and at stride 1 ``activation``."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.reparam_conv = nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups)
        self.w, self.b = _scalar(1.0), _scalar(0.0)
        self.activation = LearnableHardswish() if stride != 2 else None

    def forward(self, x):
        x = self.w * self.reparam_conv(x) + self.b
        return x if self.activation is None else self.activation(x)


class SELayer(nn.Module):
    """PPLCNetV3's squeeze-excite: pooled 1x1 (ratio 4) + relu, 1x1 + hardsigmoid (slope 1/6)."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.conv2(F.relu(self.conv1(F.adaptive_avg_pool2d(x, 1)))))


class LCNetV3Block(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int, use_se: bool):
        super().__init__()
        self.dw_conv = RepConv(cin, cin, kernel_size, stride, groups=cin)
        self.se = SELayer(cin) if use_se else None
        self.pw_conv = RepConv(cin, cout, 1)

    def forward(self, x):
        x = self.dw_conv(x)
        if self.se is not None:
            x = self.se(x)
        return self.pw_conv(x)


class PPLCNetV3Det(nn.Module):
    """Stem, stages 2-6, and ``layer_list``: the four 1x1 convs giving the neck its inputs (strides 4 to 32)."""

    def __init__(self, scale: float = 0.75):
        super().__init__()

        def width(channels: int) -> int:
            return _divisible16(channels * scale)

        self.conv1 = ConvBN(3, width(16), 3, 2)
        for stage, rows in _STAGES.items():
            setattr(
                self, stage, nn.Sequential(*[LCNetV3Block(width(i), width(o), k, s, se) for k, i, o, s, se in rows])
            )
        stage_out = [width(_STAGES[stage][-1][2]) for stage in ("blocks3", "blocks4", "blocks5", "blocks6")]
        self.out_channels = [int(c * scale) for c in _NECK_INPUTS]
        self.layer_list = nn.ModuleList([nn.Conv2d(i, o, 1) for i, o in zip(stage_out, self.out_channels)])

    def forward(self, x):
        x = self.blocks2(self.conv1(x))
        features = []
        for stage in (self.blocks3, self.blocks4, self.blocks5, self.blocks6):
            x = stage(x)
            features.append(x)
        return [conv(f) for conv, f in zip(self.layer_list, features)]


class SEModule(nn.Module):
    """The neck's squeeze-excite: gate ``clip(0.2 x + 0.5, 0, 1)`` (Paddle's hardsigmoid at slope 0.2)."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        gate = self.conv2(F.relu(self.conv1(F.adaptive_avg_pool2d(x, 1))))
        return x * torch.clamp(0.2 * gate + 0.5, 0.0, 1.0)


class RSELayer(nn.Module):
    """Bias-free conv (``in_conv``), then ``x + se_block(x)`` (shortcut) or ``se_block(x)``."""

    def __init__(self, cin: int, cout: int, kernel_size: int, shortcut: bool = True):
        super().__init__()
        self.in_conv = nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2, bias=False)
        self.se_block = SEModule(cout)
        self.shortcut = shortcut

    def forward(self, x):
        x = self.in_conv(x)
        return x + self.se_block(x) if self.shortcut else self.se_block(x)


def _up(x, factor: int):
    return F.interpolate(x, scale_factor=factor, mode="nearest")


class RSEFPN(nn.Module):
    """Top-down sum of the four lateral RSE layers (``ins_conv``), an RSE layer on each level (``inp_conv``,
    a quarter of the channels), upsampled to stride 4 and concatenated: no normalization anywhere."""

    def __init__(self, in_channels: list[int], out_channels: int = 96, shortcut: bool = True):
        super().__init__()
        self.out_channels = out_channels
        self.ins_conv = nn.ModuleList([RSELayer(c, out_channels, 1, shortcut) for c in in_channels])
        self.inp_conv = nn.ModuleList([RSELayer(out_channels, out_channels // 4, 3, shortcut) for _ in in_channels])

    def forward(self, features):
        in2, in3, in4, in5 = (conv(f) for conv, f in zip(self.ins_conv, features))
        out4 = in4 + _up(in5, 2)
        out3 = in3 + _up(out4, 2)
        out2 = in2 + _up(out3, 2)
        p5, p4, p3, p2 = (conv(x) for conv, x in zip(self.inp_conv[::-1], (in5, out4, out3, out2)))
        return torch.cat([_up(p5, 8), _up(p4, 4), _up(p3, 2), p2], dim=1)


class DBBranch(nn.Module):
    """3x3 conv (bias-free) + BN + relu, 2x2 stride-2 transposed conv + BN + relu, 2x2 transposed conv, sigmoid."""

    def __init__(self, in_channels: int):
        super().__init__()
        mid = in_channels // 4
        self.conv1 = nn.Conv2d(in_channels, mid, 3, padding=1, bias=False)
        self.conv_bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.ConvTranspose2d(mid, mid, 2, stride=2)
        self.conv_bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.ConvTranspose2d(mid, 1, 2, stride=2)

    def forward(self, x):
        x = F.relu(self.conv_bn1(self.conv1(x)))
        x = F.relu(self.conv_bn2(self.conv2(x)))
        return torch.sigmoid(self.conv3(x))


class DBHead(nn.Module):
    """Train mode: maps = [shrink, threshold, binary] (N, 3, H, W); eval mode: the shrink map (N, 1, H, W)."""

    def __init__(self, in_channels: int, k: float = 50):
        super().__init__()
        self.k = k
        self.binarize = DBBranch(in_channels)
        self.thresh = DBBranch(in_channels)

    def forward(self, x):
        shrink = self.binarize(x)
        if not self.training:
            return {"maps": shrink}
        threshold = self.thresh(x)
        binary = torch.reciprocal(1 + torch.exp(-self.k * (shrink - threshold)))
        return {"maps": torch.cat([shrink, threshold, binary], dim=1)}


class PPOCRv4Det(nn.Module):
    """``backbone`` -> ``neck`` -> ``head``; returns the head's ``{"maps": ...}`` as PaddleOCR's BaseModel does."""

    def __init__(self, backbone: nn.Module, neck: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.neck, self.head = backbone, neck, head

    def forward(self, x):
        return self.head(self.neck(self.backbone(x)))


def build_det_model(arch: dict) -> PPOCRv4Det:
    """The network an ``Architecture`` section describes (PPLCNetV3 + RSEFPN + DBHead only)."""
    for part, name in (("Backbone", "PPLCNetV3"), ("Neck", "RSEFPN"), ("Head", "DBHead")):
        if arch[part].get("name") != name:
            raise ValueError(f"Architecture.{part} must be {name} for the PP-OCRv4 det network, got {arch[part]}")
    backbone = PPLCNetV3Det(scale=arch["Backbone"].get("scale", 0.75))
    neck = RSEFPN(backbone.out_channels, arch["Neck"]["out_channels"], arch["Neck"].get("shortcut", True))
    return PPOCRv4Det(backbone, neck, DBHead(neck.out_channels, k=arch["Head"].get("k", 50)))


def torch_name(shipped: str) -> str:
    """The torch ``state_dict`` key of a shipped tensor: BatchNorm statistics are named as torch names them."""
    return shipped.replace("._mean", ".running_mean").replace("._variance", ".running_var")


def load_params(model: nn.Module, params: dict[str, np.ndarray]) -> list[str]:
    """Copy the shipped tensors into ``model``; every one must be used, and every tensor of the model shipped but
    DBHead's threshold branch and BatchNorm's batch counters. Returns the names left as they were."""
    state = model.state_dict()
    wanted = {torch_name(name): torch.from_numpy(np.asarray(a, dtype=np.float32)) for name, a in params.items()}
    unshipped = sorted(k for k in set(state) - set(wanted) if not k.endswith("num_batches_tracked"))
    missing = [name for name in unshipped if not name.startswith(NOT_SHIPPED)]
    unused = sorted(set(wanted) - set(state))
    if missing or unused:
        raise ValueError(f"shipped tensors do not fit the model: missing {missing[:5]}, unused {unused[:5]}")
    with torch.no_grad():
        for name, value in wanted.items():
            if state[name].shape != value.shape:
                raise ValueError(f"{name}: model shape {tuple(state[name].shape)}, shipped {tuple(value.shape)}")
            state[name].copy_(value)
    return unshipped


class DBLoss(nn.Module):
    """PaddleOCR's DBLoss for ``maps`` (N, 3, H, W) = [shrink, threshold, binary]: ``alpha`` x the balanced
    (hard-negative mined, ``ohem_ratio``) dice loss on the shrink map, ``beta`` x the masked L1 on the threshold
    map, and the dice loss on the binary map. ``labels`` are the KeepKeys list ``[image, threshold_map,
    threshold_mask, shrink_map, shrink_mask]``; returns the term dict PaddleOCR logs (``loss`` is the total)."""

    def __init__(self, balance_loss=True, main_loss_type="DiceLoss", alpha=5, beta=10, ohem_ratio=3, eps=1e-6, **_):
        super().__init__()
        if main_loss_type != "DiceLoss":
            raise ValueError(f"only main_loss_type DiceLoss is written here, got {main_loss_type!r}")
        self.balance_loss, self.alpha, self.beta, self.ohem_ratio, self.eps = balance_loss, alpha, beta, ohem_ratio, eps

    def _dice(self, pred, gt, mask):
        intersection = (pred * gt * mask).sum()
        return 1 - 2.0 * intersection / ((pred * mask).sum() + (gt * mask).sum() + self.eps)

    def _balanced(self, pred, gt, mask):
        # Dice is one number for the map, so mining ranks that number per pixel, exactly as upstream does
        loss = self._dice(pred, gt, mask)
        if not self.balance_loss:
            return loss
        positive, negative = gt * mask, (1 - gt) * mask
        positive_count = int(positive.sum())
        negative_count = int(min(float(negative.sum()), positive_count * self.ohem_ratio))
        positive_loss = (positive * loss).sum()
        if negative_count > 0:
            hardest = torch.sort((negative * loss).reshape(-1), descending=True).values[:negative_count]
            return (positive_loss + hardest.sum()) / (positive_count + negative_count + self.eps)
        return positive_loss / (positive_count + self.eps)

    def forward(self, predicts: dict, labels) -> dict:
        maps = predicts["maps"]
        threshold_map, threshold_mask, shrink_map, shrink_mask = labels[1:5]
        shrink, threshold, binary = maps[:, 0], maps[:, 1], maps[:, 2]
        loss_shrink = self.alpha * self._balanced(shrink, shrink_map, shrink_mask)
        l1 = (torch.abs(threshold - threshold_map) * threshold_mask).sum() / (threshold_mask.sum() + self.eps)
        loss_threshold = self.beta * l1
        loss_binary = self._dice(binary, shrink_map, shrink_mask)
        return {
            "loss": loss_shrink + loss_threshold + loss_binary,
            "loss_shrink_maps": loss_shrink,
            "loss_threshold_maps": loss_threshold,
            "loss_binary_maps": loss_binary,
        }
