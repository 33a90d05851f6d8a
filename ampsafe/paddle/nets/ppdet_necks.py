"""PaddleDetection necks: the AMP-safe FPN, and the evidence that the PP-YOLO family needs no variant.

What ppdet 2.6.0 builds (``ppdet/modeling/necks/yolo_fpn.py``, ``fpn.py``):

* ``YOLOv3FPN``, ``PPYOLOFPN``, ``PPYOLOTinyFPN``, ``PPYOLOPAN``: every conv is a darknet ``ConvBNLayer``
  (bias-free conv, BatchNorm, leaky/mish activation), including SPP, CoordConv, the detection blocks and the
  routes; the rest is upsample/concat/max-pool/DropBlock routing. No unnormalized path, so no variant:
  ``swap_neck`` refuses those configs and says so (:data:`ampsafe.patches.registry.ALREADY_SAFE`);
  ``normalized_conv_report`` checks it on a built neck. PP-YOLOE's ``CustomCSPPAN`` (``custom_pan.py``) is
  the same: conv + BN blocks only.
* The unnormalized convs of a YOLO model are the head's final 1x1 convs (``YOLOv3Head.yolo_outputs``): their
  outputs are the raw predictions the loss reads, so normalizing them would change the model. They are left
  to ``ampsafe.patch(model)`` (FP32 islands when a scan finds them risky) and to the loss-scale floor.
* ``FPN`` (Faster R-CNN) defaults to ``norm_type=None``: plain convs with bias on every lateral and output,
  summed top-down. ``AmpSafeFPN`` keeps those convs as they are, under upstream's names (``fpn_inner_res5_sum``,
  ``fpn_inner_res{2..4}_sum_lateral``, ``fpn_res{2..5}_sum``, ``fpn_{6..}`` with extra convs; keys
  ``<conv>.weight`` / ``<conv>.bias``), and adds one normalization layer after each, ``<conv>_norm``
  (``weight``, ``bias``, and ``_mean`` / ``_variance`` for BatchNorm). So an upstream FPN checkpoint loads with
  only the ``*_norm.*`` keys missing, as the DBFPN swap and timm's ``ConvNormAct`` keep theirs. ppdet's own
  ``norm_type="bn"`` FPN would not: it wraps each conv in a ``ConvNormLayer`` (``<conv>.conv.weight``, no bias),
  so none of an upstream checkpoint's neck keys would load. As with the DB necks, the normalization changes
  what the weights mean: fine-tune (the new norms learn), it is not an exact drop-in at eval time.

Importing this module imports ``ppdet`` (``AmpSafeFPN`` subclasses its FPN); :mod:`ampsafe.patches.ppdet_necks`
re-exports these names without importing either until one is used.
"""

from __future__ import annotations

import paddle.nn.functional as F
from paddle import ParamAttr, nn
from paddle.regularizer import L2Decay
from ppdet.modeling.necks.fpn import FPN

from ampsafe.patches import ppdet_necks as _by_name

from ...core import modpath
from ..backend import BACKEND

# the public names, listed once where ``ampsafe.patches`` reads them without importing paddle or ppdet
__all__ = list(_by_name.__all__)

NORM_SUFFIX = "_norm"  # the normalization after conv ``<name>`` is the sibling ``<name>_norm``


class AmpSafeFPN(FPN):
    """ppdet's FPN with a normalization layer after every conv, upstream's conv keys unchanged.

    The convs are upstream's (``norm_type=None`` FPN: same names, bias kept); each gets a sibling
    ``<conv>_norm`` built as ppdet's ``ConvNormLayer`` builds its norm (``bn`` / ``sync_bn``: BatchNorm2D,
    ``gn``: 32-group GroupNorm; ``norm_decay`` as L2 decay, ``freeze_norm``: learning rate 0). The forward is
    upstream's with the norm applied right after each conv. Its own ``__init__`` (same arguments as FPN) is
    what gives it a full ppdet schema: a subclass without one is registered with an empty schema and ignores
    YAML keys."""

    protection = "convbn"

    def __init__(
        self,
        in_channels,
        out_channel,
        spatial_scales=[0.25, 0.125, 0.0625, 0.03125],  # noqa: B006 (ppdet reads defaults off the signature)
        has_extra_convs=False,
        extra_stage=1,
        use_c5=True,
        norm_type="bn",
        norm_decay=0.0,
        freeze_norm=False,
        relu_before_extra_convs=True,
    ):
        if norm_type not in ("bn", "sync_bn", "gn"):
            got = "None is upstream FPN" if norm_type is None else f"got {norm_type!r}"
            raise ValueError(f"AmpSafeFPN needs a norm_type ('bn', 'sync_bn' or 'gn'); {got}")
        super().__init__(
            in_channels,
            out_channel,
            spatial_scales=list(spatial_scales),
            has_extra_convs=has_extra_convs,
            extra_stage=extra_stage,
            use_c5=use_c5,
            norm_type=None,  # upstream's plain convs, under upstream's names
            norm_decay=norm_decay,
            freeze_norm=freeze_norm,
            relu_before_extra_convs=relu_before_extra_convs,
        )
        self.norm_type = norm_type
        names = {id(layer): name for name, layer in self.named_children()}
        # plain lists, as upstream keeps its convs: each norm is registered once, under its conv's name
        self.lateral_norms = [self._add_norm(names[id(conv)], out_channel) for conv in self.lateral_convs]
        self.fpn_norms = [self._add_norm(names[id(conv)], out_channel) for conv in self.fpn_convs]

    def _add_norm(self, conv_name: str, channels: int) -> nn.Layer:
        lr = 0.0 if self.freeze_norm else 1.0
        decay = L2Decay(self.norm_decay) if self.norm_decay is not None else None
        weight, bias = ParamAttr(learning_rate=lr, regularizer=decay), ParamAttr(learning_rate=lr, regularizer=decay)
        if self.norm_type == "gn":
            norm = nn.GroupNorm(num_groups=32, num_channels=channels, weight_attr=weight, bias_attr=bias)
        else:
            norm = nn.BatchNorm2D(channels, weight_attr=weight, bias_attr=bias)
        return self.add_sublayer(conv_name + NORM_SUFFIX, norm)

    def _output(self, i: int, x):
        return self.fpn_norms[i](self.fpn_convs[i](x))

    def forward(self, body_feats):
        laterals = [norm(conv(f)) for conv, norm, f in zip(self.lateral_convs, self.lateral_norms, body_feats)]
        for lvl in range(len(laterals) - 1, 0, -1):  # top-down, as upstream
            laterals[lvl - 1] = laterals[lvl - 1] + F.interpolate(laterals[lvl], scale_factor=2.0, mode="nearest")
        num_levels = len(laterals)
        fpn_output = [self._output(lvl, laterals[lvl]) for lvl in range(num_levels)]
        if self.extra_stage > 0:
            if not self.has_extra_convs:  # max pool for the extra level (Faster R-CNN, Mask R-CNN)
                assert self.extra_stage == 1, "extra_stage should be 1 if FPN has not extra convs"
                fpn_output.append(F.max_pool2d(fpn_output[-1], 1, stride=2))
            else:  # extra conv levels (RetinaNet: use_c5, FCOS: use_p5)
                source = body_feats[-1] if self.use_c5 else fpn_output[-1]
                fpn_output.append(self._output(num_levels, source))
                for i in range(1, self.extra_stage):
                    x = F.relu(fpn_output[-1]) if self.relu_before_extra_convs else fpn_output[-1]
                    fpn_output.append(self._output(num_levels + i, x))
        return fpn_output


_NORMS = (nn.BatchNorm2D, nn.BatchNorm, nn.SyncBatchNorm, nn.GroupNorm)


def normalized_conv_report(layer: nn.Layer) -> dict[str, bool]:
    """For every ``Conv2D`` in ``layer``: is it normalized, i.e. the ``conv`` of a conv+norm block (a parent
    holding exactly one conv and a normalization layer), or a conv ``<name>`` with a normalization sibling
    ``<name>_norm`` (AmpSafeFPN's layout)? ``{conv path: normalized}``; the evidence behind ALREADY_SAFE."""
    report = {}
    for parent_name, parent in BACKEND.modules(layer).items():
        children = dict(parent.named_children())
        convs = [n for n, c in children.items() if isinstance(c, nn.Conv2D)]
        has_norm = any(isinstance(c, _NORMS) for c in children.values())
        for n in convs:
            paired = isinstance(children.get(n + NORM_SUFFIX), _NORMS)
            report[modpath.join(parent_name, n)] = paired or (has_norm and len(convs) == 1)
    return report
