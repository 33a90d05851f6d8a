"""PaddleOCR's PP-OCRv4 mobile text detector, as its trained weights ship for inference.

    params = read_inference_params(model_dir)            # {structured name: ndarray}, 234 tensors
    model = build_det_model(arch)                        # or build_with_paddleocr(arch, src) from a PaddleOCR tree
    load_params(model, params)
    maps = run_inference(model_dir, image)               # Paddle Inference on the shipped .pdmodel

The network is ``ch_PP-OCRv4_det_student.yml``'s: PPLCNetV3 (scale 0.75, ``det: True``) + RSEFPN (96 channels,
shortcut) + DBHead (k 50). The shipped files were exported after the backbone's re-parameterization, so each
learnable rep layer is one convolution with a bias (``reparam_conv``) followed by a learnable affine (``w``,
``b``) and, except at stride 2, a hardswish with its own learnable affine (``activation.scale``/``.bias``).
:func:`build_det_model` defines that form with exactly the names in ``inference.pdiparams.info``, so its
``state_dict`` keys are the shipped tensor names, one for one. PaddleOCR's own code calls the two affines
``lab`` and ``act.lab`` (:func:`paddleocr_name` maps between them).

Paddle code, so it lives here; :mod:`ampsafe_lab.workloads.ppocrv4` names it and imports it only when it builds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from ampsafe.paddle.nets.paddleocr_necks import RSEFPN

from ...workloads.ppocrv4 import network
from .backbones import ConvBNAct
from .dbnet import DBNet
from .heads import DBHead

__all__ = [
    "PPLCNetV3Det",
    "build_det_model",
    "build_with_paddleocr",
    "NOT_SHIPPED",
    "load_params",
    "paddleocr_name",
    "read_inference_params",
    "run_inference",
]

# DBHead's threshold branch, which the export does not ship (it keeps its initialization)
NOT_SHIPPED = network.NOT_SHIPPED


def _add_scalar(layer: nn.Layer, name: str, value: float) -> None:
    """A learned scalar parameter ``name`` (shape [1]) on ``layer``, initialized to ``value``."""
    layer.add_parameter(name, layer.create_parameter([1], default_initializer=nn.initializer.Constant(value)))


class LearnableHardswish(nn.Layer):
    """hardswish, then a learned scalar affine: ``scale * hardswish(x) + bias``."""

    def __init__(self):
        super().__init__()
        _add_scalar(self, "scale", 1.0)
        _add_scalar(self, "bias", 0.0)

    def forward(self, x):
        return self.scale * F.hardswish(x) + self.bias


class RepConv(network.RepForward, nn.Layer):
    """A re-parameterized learnable rep layer: ``reparam_conv`` (with bias), affine ``w``/``b``, and at stride 1
    a :class:`LearnableHardswish` (``activation``). The branches it was fused from are gone: what runs at
    inference, and what fine-tuning the shipped model trains, is this."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.stride = stride
        self.reparam_conv = nn.Conv2D(
            in_channels, out_channels, kernel_size, stride=stride, padding=(kernel_size - 1) // 2, groups=groups
        )
        _add_scalar(self, "w", 1.0)
        _add_scalar(self, "b", 0.0)
        self.activation = LearnableHardswish() if stride != 2 else None


class SELayer(nn.Layer):
    """PPLCNetV3's squeeze-excite: pooled 1x1 (ratio 4) + relu, 1x1 + hardsigmoid (slope 1/6)."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2D(1)
        self.conv1 = nn.Conv2D(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2D(channels // reduction, channels, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.conv2(F.relu(self.conv1(self.avg_pool(x)))))


class LCNetV3Block(network.BlockForward, nn.Layer):
    """Depthwise rep layer (``dw_conv``), optional squeeze-excite (``se``), pointwise rep layer (``pw_conv``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, use_se: bool):
        super().__init__()
        self.dw_conv = RepConv(in_channels, in_channels, kernel_size, stride=stride, groups=in_channels)
        self.se = SELayer(in_channels) if use_se else None
        self.pw_conv = RepConv(in_channels, out_channels, 1)


class PPLCNetV3Det(network.BackboneForward, nn.Layer):
    """PPLCNetV3 for detection, re-parameterized: stem conv + BN, stages 2-6, and ``layer_list``: four 1x1 convs
    (with bias) that give the neck its inputs from stages 3, 4, 5 and 6 (strides 4, 8, 16, 32)."""

    def __init__(self, scale: float = 0.75, in_channels: int = 3, **_ignored):
        super().__init__()
        self.conv1 = ConvBNAct(in_channels, network.width(16, scale), 3, stride=2, padding=1)
        for stage, rows in network.backbone_stages(scale).items():
            setattr(self, stage, nn.Sequential(*[LCNetV3Block(cin, cout, k, s, se) for k, cin, cout, s, se in rows]))
        convs = network.neck_inputs(scale)
        self.out_channels = [cout for _, cout in convs]
        self.layer_list = nn.LayerList([nn.Conv2D(cin, cout, 1) for cin, cout in convs])


def build_det_model(arch: dict) -> DBNet:
    """The project's own PP-OCRv4 det network from an ``Architecture`` section (PPLCNetV3 + RSEFPN + DBHead)."""
    spec = network.det_spec(arch)
    backbone = PPLCNetV3Det(scale=spec.scale)
    neck = RSEFPN(backbone.out_channels, spec.neck_channels, shortcut=spec.shortcut)
    return DBNet(backbone, neck, DBHead(neck.out_channels, k=spec.k))


_PADDLEOCR_NAMES = (
    (re.compile(r"\.(dw_conv|pw_conv)\.w$"), r".\1.lab.scale"),
    (re.compile(r"\.(dw_conv|pw_conv)\.b$"), r".\1.lab.bias"),
    (re.compile(r"\.(dw_conv|pw_conv)\.activation\.(scale|bias)$"), r".\1.act.lab.\2"),
)


def paddleocr_name(shipped: str) -> str:
    """The name PaddleOCR's ``rec_lcnetv3.py`` gives the tensor the export calls ``shipped`` (the affines differ)."""
    for pattern, replacement in _PADDLEOCR_NAMES:
        shipped = pattern.sub(replacement, shipped)
    return shipped


def build_with_paddleocr(arch: dict, src: str | Path, *, reparameterize: bool = True) -> nn.Layer:
    """The network built by PaddleOCR's own ``build_model`` from the tree at ``src``, re-parameterized as the
    shipped export is: every learnable rep layer fused (``rep()``), the fused-away branches and the unused
    stride-2 activations dropped, so that its ``state_dict`` holds the shipped tensors and nothing else
    (under :func:`paddleocr_name`). ``reparameterize=False``: as ``build_model`` returns it, the form
    ``tools/train.py`` trains (:mod:`ampsafe_lab.workloads.ppocrv4.train_form` fills it)."""
    src = str(Path(src).resolve())
    added = src not in sys.path
    if added:  # on the path for this import only: the caller's sys.path is left as it was
        sys.path.insert(0, src)
    try:
        from ppocr.modeling.architectures import build_model
        from ppocr.modeling.backbones.rec_lcnetv3 import LearnableRepLayer
    finally:
        if added and src in sys.path:
            sys.path.remove(src)

    model = build_model(dict(arch))
    if not reparameterize:
        return model
    for layer in model.sublayers():
        if isinstance(layer, LearnableRepLayer):
            layer.rep()
            for branch in ("identity", "conv_1x1", "conv_kxk") + (("act",) if layer.stride == 2 else ()):
                delattr(layer, branch)
    return model


def load_params(model: nn.Layer, params: dict[str, np.ndarray], *, rename=None) -> list[str]:
    """Copy the shipped tensors into ``model`` by name (``rename`` maps a shipped name to the model's), once
    :func:`~ampsafe_lab.workloads.ppocrv4.network.check_fit` finds they fit. Returns the names left as they were."""
    rename = rename or (lambda name: name)
    wanted = {rename(name): array for name, array in params.items()}
    state = model.state_dict()
    unshipped = network.check_fit(
        {name: tuple(t.shape) for name, t in state.items()}, {n: a.shape for n, a in wanted.items()}
    )
    for name, array in wanted.items():
        state[name].set_value(array.astype(np.float32))
    return unshipped


def _prefix(model_dir: str | Path) -> str:
    return str(Path(model_dir) / "inference")


def read_inference_params(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The tensors of ``model_dir/inference.pdiparams`` under their structured names (``.pdiparams.info``).

    The ``.pdmodel`` is the legacy program format, which Paddle 3 loads in its old-IR static mode only; the
    program is loaded in a scope of its own and dynamic mode is restored before returning.
    """
    import pickle

    from paddle.pir_utils import OldIrGuard

    with open(_prefix(model_dir) + ".pdiparams.info", "rb") as handle:
        info = pickle.load(handle)
    scope = paddle.static.Scope()
    was_dynamic = paddle.in_dynamic_mode()
    with OldIrGuard():
        paddle.enable_static()
        try:
            with paddle.static.scope_guard(scope):
                program, _, _ = paddle.static.load_inference_model(
                    _prefix(model_dir), paddle.static.Executor(paddle.CPUPlace())
                )
                names = [v.name for v in program.list_vars() if v.persistable and v.name not in ("feed", "fetch")]
                arrays = {info[n]["structured_name"]: np.array(scope.find_var(n).get_tensor()) for n in names}
        finally:
            if was_dynamic:
                paddle.disable_static()
    return arrays


def run_inference(model_dir: str | Path, images: np.ndarray, *, ir_optim: bool = True) -> np.ndarray:
    """Paddle Inference on the shipped ``.pdmodel``/``.pdiparams`` (CPU, as a deployment runs it): the
    probability map (N, 1, H, W) for normalized NCHW float32 ``images``."""
    from paddle import inference

    config = inference.Config(_prefix(model_dir) + ".pdmodel", _prefix(model_dir) + ".pdiparams")
    config.disable_gpu()
    config.disable_glog_info()
    config.switch_ir_optim(ir_optim)
    predictor = inference.create_predictor(config)
    feed = predictor.get_input_handle(predictor.get_input_names()[0])
    feed.reshape(list(images.shape))
    feed.copy_from_cpu(np.ascontiguousarray(images, dtype=np.float32))
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
