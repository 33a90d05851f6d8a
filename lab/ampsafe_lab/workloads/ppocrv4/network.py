"""The PP-OCRv4 mobile det network's structure, framework-neutral: what both frameworks' nets build from.

    spec = det_spec(arch)                     # the Architecture section checked: scale, neck width, shortcut, k
    for stage, rows in backbone_stages(spec.scale).items(): ...

:mod:`ampsafe_lab.nets.paddle.ppocrv4` and :mod:`ampsafe_lab.nets.torch.ppocrv4` define the layers in their framework;
the block table, the channel rounding, the forwards that only compose sublayers, and the check that the shipped
tensors fit a model are written here once, so the two networks cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "NOT_SHIPPED",
    "DetSpec",
    "det_spec",
    "width",
    "backbone_stages",
    "neck_inputs",
    "check_fit",
    "RepForward",
    "BlockForward",
    "BackboneForward",
]

# stage -> (kernel, in channels, out channels, stride, squeeze-excite) at scale 1, PPLCNetV3's detection layout
_STAGES = {
    "blocks2": [(3, 16, 32, 1, False)],
    "blocks3": [(3, 32, 64, 2, False), (3, 64, 64, 1, False)],
    "blocks4": [(3, 64, 128, 2, False), (3, 128, 128, 1, False)],
    "blocks5": [(3, 128, 256, 2, False)] + [(5, 256, 256, 1, False)] * 4,
    "blocks6": [(5, 256, 512, 2, True), (5, 512, 512, 1, True), (5, 512, 512, 1, False), (5, 512, 512, 1, False)],
}
# the stages whose outputs feed the neck (strides 4, 8, 16, 32)
_FEATURE_STAGES = ("blocks3", "blocks4", "blocks5", "blocks6")
# channels of the 1x1 convs that turn stages 3-6 into the four neck inputs, at scale 1
_NECK_INPUTS = (16, 24, 56, 480)
# DBHead's threshold branch only feeds the training loss: the inference export drops it, so it is not shipped
NOT_SHIPPED = ("head.thresh.",)


@dataclass(frozen=True)
class DetSpec:
    """What an ``Architecture`` section sets of the PP-OCRv4 det network."""

    scale: float
    neck_channels: int
    shortcut: bool
    k: float


def det_spec(arch: dict) -> DetSpec:
    """The section checked to be PPLCNetV3 + RSEFPN + DBHead (the only network written here), and its settings."""
    for part, name in (("Backbone", "PPLCNetV3"), ("Neck", "RSEFPN"), ("Head", "DBHead")):
        if arch[part].get("name") != name:
            raise ValueError(f"Architecture.{part} must be {name} for the PP-OCRv4 det network, got {arch[part]}")
    return DetSpec(
        scale=arch["Backbone"].get("scale", 0.75),
        neck_channels=arch["Neck"]["out_channels"],
        shortcut=arch["Neck"].get("shortcut", True),
        k=arch["Head"].get("k", 50),
    )


def width(channels: int, scale: float) -> int:
    """PPLCNetV3's channel count at ``scale``: the nearest multiple of 16, never more than 10% below."""
    value = channels * scale
    rounded = max(16, int(value + 8) // 16 * 16)
    return rounded + 16 if rounded < 0.9 * value else rounded


def backbone_stages(scale: float) -> dict[str, list[tuple[int, int, int, int, bool]]]:
    """stage -> its blocks' (kernel, in channels, out channels, stride, squeeze-excite) at ``scale``."""
    return {
        stage: [(k, width(cin, scale), width(cout, scale), s, se) for k, cin, cout, s, se in rows]
        for stage, rows in _STAGES.items()
    }


def neck_inputs(scale: float) -> list[tuple[int, int]]:
    """(in, out) channels of the four 1x1 convs (``layer_list``) from stages 3-6 to the neck, at ``scale``."""
    stage_out = [width(_STAGES[stage][-1][2], scale) for stage in _FEATURE_STAGES]
    return list(zip(stage_out, [int(c * scale) for c in _NECK_INPUTS]))


def check_fit(model: dict[str, tuple], shipped: dict[str, tuple]) -> list[str]:
    """The shapes of a model's tensors and of the shipped ones, by name: every shipped tensor must be used, with
    the same shape, and every tensor of the model shipped but DBHead's threshold branch (:data:`NOT_SHIPPED`),
    which keeps its initialization. Raises ValueError otherwise; returns the model's names not shipped."""
    unshipped = sorted(set(model) - set(shipped))
    missing = [name for name in unshipped if not name.startswith(NOT_SHIPPED)]
    unused = sorted(set(shipped) - set(model))
    if missing or unused:
        raise ValueError(f"shipped tensors do not fit the model: missing {missing[:5]}, unused {unused[:5]}")
    for name, shape in shipped.items():
        if tuple(model[name]) != tuple(shape):
            raise ValueError(f"{name}: model shape {tuple(model[name])}, shipped {tuple(shape)}")
    return unshipped


class RepForward:
    """A re-parameterized rep layer's forward: ``w * reparam_conv(x) + b``, then ``activation`` where it has one
    (not at stride 2). Mixed into each framework's ``RepConv`` ahead of its layer base class."""

    def forward(self, x):
        x = self.w * self.reparam_conv(x) + self.b
        return x if self.activation is None else self.activation(x)


class BlockForward:
    """An LCNetV3 block's forward: ``dw_conv``, the squeeze-excite ``se`` where it has one, ``pw_conv``."""

    def forward(self, x):
        x = self.dw_conv(x)
        if self.se is not None:
            x = self.se(x)
        return self.pw_conv(x)


class BackboneForward:
    """The backbone's forward: stem and stage 2, then stages 3-6, each output turned by its ``layer_list`` conv
    into one of the neck's four inputs."""

    def forward(self, x):
        x = self.blocks2(self.conv1(x))
        features = []
        for stage in _FEATURE_STAGES:
            x = getattr(self, stage)(x)
            features.append(x)
        return [conv(f) for conv, f in zip(self.layer_list, features)]
