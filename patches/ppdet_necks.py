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
  summed top-down. ``AmpSafeFPN`` is ppdet's own FPN with ``norm_type="bn"`` by default, so each conv becomes a
  ``ConvNormLayer`` (keys ``<conv>.conv.weight`` and ``<conv>.norm.*`` instead of ``<conv>.weight/.bias``):
  train from scratch / from an upstream backbone.
"""

from __future__ import annotations

from paddle import nn
from ppdet.modeling.necks.fpn import FPN

__all__ = ["AmpSafeFPN", "normalized_conv_report"]


class AmpSafeFPN(FPN):
    """ppdet's FPN with BatchNorm after every conv. Its own ``__init__`` (same arguments as FPN) is what gives
    it a full ppdet schema: a subclass without one is registered with an empty schema and ignores YAML keys."""

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
        if norm_type is None:
            raise ValueError("AmpSafeFPN needs a norm_type ('bn', 'sync_bn' or 'gn'); None is upstream FPN")
        super().__init__(
            in_channels,
            out_channel,
            spatial_scales=list(spatial_scales),
            has_extra_convs=has_extra_convs,
            extra_stage=extra_stage,
            use_c5=use_c5,
            norm_type=norm_type,
            norm_decay=norm_decay,
            freeze_norm=freeze_norm,
            relu_before_extra_convs=relu_before_extra_convs,
        )


_NORMS = (nn.BatchNorm2D, nn.BatchNorm, nn.SyncBatchNorm, nn.GroupNorm)


def normalized_conv_report(layer: nn.Layer) -> dict[str, bool]:
    """For every ``Conv2D`` in ``layer``: is it the ``conv`` of a conv+norm block (a parent holding exactly one
    conv and a normalization layer)? ``{conv path: normalized}``; the evidence behind ALREADY_SAFE."""
    report = {}
    for parent_name, parent in [("", layer), *layer.named_sublayers()]:
        children = list(parent.named_children())
        convs = [n for n, c in children if isinstance(c, nn.Conv2D)]
        has_norm = any(isinstance(c, _NORMS) for _, c in children)
        for n in convs:
            report[f"{parent_name}.{n}" if parent_name else n] = has_norm and len(convs) == 1
    return report
