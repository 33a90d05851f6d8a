"""PaddleOCR's PP-OCRv4 mobile text detector in PyTorch, module for module as PaddleOCR names it.

    model = build_det_model(arch)                 # the ``Architecture`` section of ch_PP-OCRv4_det_student.yml
    load_params(model, params)                    # the shipped tensors, {structured name: ndarray}

The same network as :mod:`ampsafe_lab.nets.paddle.ppocrv4` (PPLCNetV3 x0.75 re-parameterized, RSEFPN 96, DBHead),
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

from ...workloads.ppocrv4 import network

__all__ = ["PPLCNetV3Det", "RSEFPN", "DBHead", "DBLoss", "PPOCRv4Det", "build_det_model", "load_params", "NOT_SHIPPED"]

# DBHead's threshold branch, which the export does not ship (it keeps its initialization)
NOT_SHIPPED = network.NOT_SHIPPED


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


class RepConv(network.RepForward, nn.Module):
    """A re-parameterized learnable rep layer: ``reparam_conv``, affine ``w``/``b``, and at stride 1 ``activation``."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.reparam_conv = nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups)
        self.w, self.b = _scalar(1.0), _scalar(0.0)
        self.activation = LearnableHardswish() if stride != 2 else None


class SELayer(nn.Module):
    """PPLCNetV3's squeeze-excite: pooled 1x1 (ratio 4) + relu, 1x1 + hardsigmoid (slope 1/6)."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2d(channels // reduction, channels, 1)

    def gate(self, x):
        """The excitation's squashing: torch's hardsigmoid (slope 1/6), Paddle's in the backbone."""
        return F.hardsigmoid(x)

    def forward(self, x):
        return x * self.gate(self.conv2(F.relu(self.conv1(F.adaptive_avg_pool2d(x, 1)))))


class LCNetV3Block(network.BlockForward, nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int, use_se: bool):
        super().__init__()
        self.dw_conv = RepConv(cin, cin, kernel_size, stride, groups=cin)
        self.se = SELayer(cin) if use_se else None
        self.pw_conv = RepConv(cin, cout, 1)


class PPLCNetV3Det(network.BackboneForward, nn.Module):
    """Stem, stages 2-6, and ``layer_list``: the four 1x1 convs giving the neck its inputs (strides 4 to 32)."""

    def __init__(self, scale: float = 0.75):
        super().__init__()
        self.conv1 = ConvBN(3, network.width(16, scale), 3, 2)
        for stage, rows in network.backbone_stages(scale).items():
            setattr(self, stage, nn.Sequential(*[LCNetV3Block(i, o, k, s, se) for k, i, o, s, se in rows]))
        convs = network.neck_inputs(scale)
        self.out_channels = [cout for _, cout in convs]
        self.layer_list = nn.ModuleList([nn.Conv2d(cin, cout, 1) for cin, cout in convs])


class SEModule(SELayer):
    """The neck's squeeze-excite: the backbone's, gated by ``clip(0.2 x + 0.5, 0, 1)`` (Paddle's hardsigmoid at
    slope 0.2)."""

    def gate(self, x):
        return torch.clamp(0.2 * x + 0.5, 0.0, 1.0)


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
    spec = network.det_spec(arch)
    backbone = PPLCNetV3Det(scale=spec.scale)
    neck = RSEFPN(backbone.out_channels, spec.neck_channels, spec.shortcut)
    return PPOCRv4Det(backbone, neck, DBHead(neck.out_channels, k=spec.k))


def torch_name(shipped: str) -> str:
    """The torch ``state_dict`` key of a shipped tensor: BatchNorm statistics are named as torch names them."""
    return shipped.replace("._mean", ".running_mean").replace("._variance", ".running_var")


def load_params(model: nn.Module, params: dict[str, np.ndarray]) -> list[str]:
    """Copy the shipped tensors into ``model``, once :func:`~ampsafe_lab.workloads.ppocrv4.network.check_fit` finds
    they fit (BatchNorm's batch counters aside). Returns the names left as they were."""
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    wanted = {torch_name(name): torch.from_numpy(np.asarray(a, dtype=np.float32)) for name, a in params.items()}
    unshipped = network.check_fit(
        {name: tuple(t.shape) for name, t in state.items()}, {n: tuple(v.shape) for n, v in wanted.items()}
    )
    with torch.no_grad():
        for name, value in wanted.items():
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
