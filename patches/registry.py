"""Which upstream neck has which AMP-safe variant: the one table the config swap and the registrations read.

Kept free of paddle/ppdet imports so that ``ampsafe swap-neck`` (a text rewrite) starts instantly; the classes
are named by ``module:attribute`` and imported only when something builds them.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from importlib import metadata

__all__ = [
    "SafeNeck",
    "SAFE_NECKS",
    "ALREADY_SAFE",
    "already_safe_reason",
    "TREE_ONLY",
    "NOT_COVERED",
    "not_covered_reason",
    "SETTING_SAFE",
    "setting_safe_reason",
    "neck_table",
    "render_neck_table",
    "ppdet_version",
    "safe_neck",
    "safe_names",
    "supported",
    "load_class",
]

PADDLEOCR = "paddleocr"
PADDLEDET = "paddledet"


@dataclass(frozen=True)
class SafeNeck:
    ecosystem: str  # "paddleocr" | "paddledet"
    upstream: str  # the neck name in upstream configs
    name: str  # the name the safe variant is registered / written under
    target: str  # "module:attribute" of the class
    new_keys: str  # the state_dict keys the variant adds (an upstream checkpoint lacks only these)
    # variants built by one rule (ampsafe.patches.normed_necks): the upstream class ("module:attribute" in the
    # ppocr / ppdet in use) and the fnmatch patterns of the convs / nn.Linear layers that get a norm after them
    # (<conv>.bn.*, <linear>.norm.*)
    upstream_class: str = ""
    normalizes: tuple[str, ...] = ()


# where the classes are defined: Paddle code, in the Paddle package (ampsafe.patches.*_necks re-export them)
_OCR = "ampsafe.paddle.nets.paddleocr_necks"
_DET = "ampsafe.paddle.nets.ppdet_necks"
_NORMED = "ampsafe.patches.normed_necks"  # the variants made by one rule: upstream class + a norm per layer


def _normed(ecosystem: str, upstream_class: str, *convs: str, linears: tuple[str, ...] = ()) -> SafeNeck:
    """A variant :mod:`ampsafe.patches.normed_necks` builds: ``upstream_class`` with a BatchNorm after each conv
    matching ``convs`` (new keys ``<conv>.bn.weight/bias/_mean/_variance``) and a LayerNorm after each nn.Linear
    matching ``linears`` (new keys ``<linear>.norm.weight/bias``)."""
    upstream = upstream_class.rpartition(":")[2]
    name = f"AmpSafe{upstream}"
    keys = ", ".join([*(f"{p}.bn.*" for p in convs), *(f"{p}.norm.*" for p in linears)])
    return SafeNeck(ecosystem, upstream, name, f"{_NORMED}:{name}", keys, upstream_class, (*convs, *linears))


SAFE_NECKS: dict[tuple[str, str], SafeNeck] = {
    (s.ecosystem, s.upstream): s
    for s in (
        SafeNeck(PADDLEOCR, "DBFPN", "AmpSafeDBFPN", f"{_OCR}:AmpSafeDBFPN", "in{2..5}_bn.*, p{2..5}_bn.*"),
        SafeNeck(
            PADDLEOCR,
            "RSEFPN",
            "AmpSafeRSEFPN",
            f"{_OCR}:AmpSafeRSEFPN",
            "ins_conv.{i}.in_bn.*, inp_conv.{i}.in_bn.* (+ incl{1..4}.*_bn with intracl)",
        ),
        SafeNeck(
            PADDLEOCR,
            "LKPAN",
            "AmpSafeLKPAN",
            f"{_OCR}:AmpSafeLKPAN",
            "ins_bn.{i}.*, inp_bn.{i}.*, pan_head_bn.{i}.*, pan_lat_bn.{i}.* (+ incl{1..4}.*_bn with intracl)",
        ),
        SafeNeck(
            PADDLEDET,
            "FPN",
            "AmpSafeFPN",
            f"{_DET}:AmpSafeFPN",
            "<conv>_norm.* after each conv: fpn_inner_res5_sum_norm, fpn_inner_res{2..4}_sum_lateral_norm, "
            "fpn_res{2..5}_sum_norm (+ fpn_{6..}_norm with extra convs)",
        ),
        # PaddleOCR: FCENet's FPN (norm_type None in its configs) and DRRG's U-Net FPN; TableFPN is in build_neck's
        # list though no config names it
        _normed(PADDLEOCR, "ppocr.modeling.necks.fce_fpn:FCEFPN", "fpn_inner_res*", "fpn_res*_sum", "fpn_[0-9]*"),
        _normed(PADDLEOCR, "ppocr.modeling.necks.fpn_unet:FPN_UNet", "up4", "up_block*"),
        _normed(PADDLEOCR, "ppocr.modeling.necks.table_fpn:TableFPN", "in*_conv", "fuse_conv"),
        # PREN's graph convs (GCN: Conv1D over the regions, then nn.Linear over the features) end its output
        _normed(PADDLEOCR, "ppocr.modeling.necks.pren_fpn:PRENFPN", "gcn_*.conv_n", linears=("gcn_*.linear",)),
        # the recognition encoder: its output is a Linear's with encoder_type 'fc' and with a cascade built
        # with_linear; at its other settings nothing matches (SETTING_SAFE: the swap refuses them)
        _normed(
            PADDLEOCR, "ppocr.modeling.necks.rnn:SequenceEncoder", linears=("encoder.fc", "encoder.encoder.*.linear")
        ),
        # PaddleDetection (2024-10 tree): CLRNet's FPN (norm_type None) and HRNet's / ViTDet's HRFPN
        _normed(PADDLEDET, "ppdet.modeling.necks.clrnet_fpn:CLRFPN", "lateral_convs.*", "fpn_convs.*"),
        _normed(PADDLEDET, "ppdet.modeling.necks.hrfpn:HRFPN", "reduction", "fpn_conv*"),
        # Mask-RT-DETR's encoder (ppdet/modeling/transformers): its mask prototypes come out of a plain 1x1 conv, the
        # last layer of enc_mask_output; the rest of it is HybridEncoder's, already safe
        _normed(PADDLEDET, "ppdet.modeling.transformers.hybrid_encoder:MaskHybridEncoder", "enc_mask_output.1"),
        # TTFNet's FPN at its default lite_neck False (ttfnet_darknet53, pafnet): its output is the last upsample's plus
        # the last shortcut, plain 3x3 convs (shortcut_num [3, 2, 1] reversed: shortcut.2 has 3); the earlier shortcuts
        # feed the next upsample's conv + BatchNorm. With lite_neck (pafnet_lite) every conv is in a conv + BatchNorm
        # block (SETTING_SAFE)
        _normed(PADDLEDET, "ppdet.modeling.necks.ttf_fpn:TTFFPN", "shortcut.2.*"),
    )
}

# Upstream necks with no unnormalized conv/matmul path to their output: nothing to swap. (ecosystem, name) -> what
# ampsafe.patches.neck_check measured on the neck built at a configuration of its tree's configs (the phrase
# follows "<owner>'s <name> "). tests/patches/test_neck_zoo.py builds every one from PaddleOCR's and
# PaddleDetection's own code (the 2024-10 tree, else the installed ppdet) and checks the verdict and the detail.
_CONV_BN = "builds every conv as a conv + BatchNorm (+ activation) block"  # and the check finds no open path
_ENDS = "ends every conv path in a BatchNorm before its output"  # measured; some convs not in one-conv blocks
INNER_LINKS = "ends every output in a normalization: its unnormalized layers"  # measured: only inner links are open
_DET_SAFE = (
    ("PPYOLOFPN", f"{_CONV_BN} (darknet ConvBNLayer; SPP, CoordConv and the detection blocks included)"),
    ("PPYOLOPAN", f"{_CONV_BN} (darknet ConvBNLayer; SPP and the CSP blocks included)"),
    ("PPYOLOTinyFPN", f"{_CONV_BN} (darknet ConvBNLayer; SPP and the depthwise detection blocks included)"),
    ("YOLOv3FPN", f"{_CONV_BN} (darknet ConvBNLayer)"),
    ("CustomCSPPAN", f"{_CONV_BN} (PP-YOLOE's ConvBNLayer / RepVGG blocks; SPP included)"),
    ("YOLOCSPPAN", f"{_CONV_BN} (YOLOX's BaseConv / CSP layers)"),
    ("BlazeNeck", f"{_CONV_BN} (BlazeFace's FPN and SSH blocks, fpn_ssh)"),
    ("CenterNetHarDNetFPN", f"{_CONV_BN} (HarDNet's ConvLayer / transition-up blocks)"),
    ("ChannelMapper", "builds every conv as a conv + GroupNorm block (norm_type 'gn', its default and PETR's)"),
    ("CSPPAN", f"{_ENDS} (PicoDet's depthwise-separable conv + BatchNorm blocks)"),
    ("LCPAN", f"{_ENDS} (PicoDet-LCNet's depthwise-separable conv + BatchNorm blocks)"),
    ("DilatedEncoder", f"{_ENDS} (YOLOF's projection: lateral conv + BatchNorm, fpn conv + BatchNorm)"),
    (
        "ESPAN",
        f"{INNER_LINKS}, the squeeze-excite gates' first convs, feed their second, sigmoid-bounded conv",
    ),
    (
        "CenterNetDLAFPN",
        f"{INNER_LINKS}, the depthwise transposed-conv upsamplers, feed deformable conv + BatchNorm blocks",
    ),
    ("BiFPN", f"{INNER_LINKS}, the separable convs' depthwise halves, feed their pointwise conv + BatchNorm"),
    # necks the configs name from outside ppdet/modeling/necks: RT-DETR's encoder (transformers/hybrid_encoder.py) and
    # ViTDet's pyramid (backbones/vit_mae.py)
    (
        "HybridEncoder",
        f"{INNER_LINKS}, the AIFI encoder layer's attention matmuls and first feed-forward linear, end in its softmax or "
        "feed a linear whose path ends in a LayerNorm; every conv is a conv + BatchNorm block (the input projections, "
        "BaseConv and RepVGG blocks)",
    ),
    (
        "SimpleFeaturePyramid",
        f"{INNER_LINKS}, the 2x stage's transposed conv, feeds a conv + LayerNorm block; every stage ends in a conv "
        "and ViTDet's channel LayerNorm (mean / variance ops, read as a norm by its class name)",
    ),
)
_OCR_SAFE = (
    ("FPN", f"{_CONV_BN} (PSENet's ConvBNLayer)"),
    ("EASTFPN", f"{_CONV_BN} (EAST's ConvBNLayer / DeConvBNLayer)"),
    ("PGFPN", f"{_CONV_BN} (PGNet's ConvBNLayer / DeConvBNLayer)"),
    ("CSPPAN", f"{_ENDS} (SLANet's depthwise-separable conv + BatchNorm blocks)"),
    ("RFAdaptor", "builds every matmul as an nn.Linear + BatchNorm1D + ReLU block (RFL's V2S / S2V adaptors)"),
    ("SASTFPN", f"{INNER_LINKS}, the cross-attention's matmuls, end in its softmax or a conv + BatchNorm"),
    ("CTFPN", f"{INNER_LINKS}, the FPEM depthwise convs, feed conv + BatchNorm smoothing blocks"),
)
ALREADY_SAFE: dict[tuple[str, str], str] = {
    **{(PADDLEDET, name): detail for name, detail in _DET_SAFE},
    **{(PADDLEOCR, name): detail for name, detail in _OCR_SAFE},
}
_READ_IN = "ppdet 2.6.0 and PaddleDetection's 2024-10 tree"  # the ppdet code ALREADY_SAFE was measured on
# measured on the 2024-10 tree only: ppdet 2.6.0 (the release on PyPI) has no such class
TREE_ONLY = frozenset({"HybridEncoder", "SimpleFeaturePyramid"})

# Upstream necks with an unnormalized path and no safe variant, and why none fits: none left (PRENFPN and
# SequenceEncoder, whose paths end in nn.Linear outputs, have variants since the rule normalizes linears too).
NOT_COVERED: dict[tuple[str, str], str] = {}

# Necks with a safe variant whose unnormalized path exists only at some settings of their config section: (ecosystem,
# name) -> (the section's key, {value: what ampsafe.patches.neck_check measured on the neck built at it}, the
# table's one-line summary). At these values the variant adds nothing, and the swap refuses with the reason (the
# phrase follows "<owner>'s <name> with <key> <value> "). tests/patches/test_neck_zoo.py builds every one and checks
# the verdict and the detail.
_LSTM = (
    "ends in paddle's LSTM, whose output, o * tanh(c), is bounded: the scan records the LSTM's input GEMM as a matmul "
    "whose path ends at that bounded output, and no conv/matmul output reaches the neck's output unnormalized"
)
SETTING_SAFE: dict[tuple[str, str], tuple[str, dict[str, str], str]] = {
    (PADDLEOCR, "SequenceEncoder"): (
        "encoder_type",
        {
            "rnn": f"{_LSTM} (EncoderWithRNN: two bidirectional layers)",
            "cascadernn": f"{_LSTM} (EncoderWithCascadeRNN without with_linear; with it, a Linear ends each stage and "
            "the variant normalizes them)",
            "reshape": "has no conv or matmul (Im2Seq only reshapes the backbone's features)",
            "svtr": f"{INNER_LINKS}, the SVTR blocks' qkv, attention and first MLP matmuls, feed further matmuls "
            "whose paths end in a LayerNorm or a conv + BatchNorm",
        },
        "the variant changes encoder_type 'fc' and 'cascadernn' with with_linear; the swap refuses the settings "
        "measured already safe: 'rnn' and 'cascadernn' without with_linear (they end in paddle's LSTM, whose output "
        "is bounded), 'reshape' (no conv or matmul), 'svtr' (only inner links open)",
    ),
    (PADDLEDET, "TTFFPN"): (
        "lite_neck",
        {"True": f"{_CONV_BN} (LiteConv / LiteUpsample: pafnet_lite's neck)"},
        "the variant changes the default lite_neck False (ttfnet_darknet53, pafnet); the swap refuses lite_neck True "
        "(pafnet_lite), measured already safe: every conv is in a conv + BatchNorm block",
    ),
}


def setting_safe_reason(ecosystem: str, name: str, section) -> str | None:
    """Why the neck ``name`` configured by ``section`` (its config mapping) needs no swap though it has a safe
    variant; None when the variant normalizes something at this setting (or ``name`` has no such settings).
    SequenceEncoder's cascade counts as 'cascadernn' only without ``with_linear``: with it, Linears end the path."""
    entry = SETTING_SAFE.get((ecosystem, name))
    if entry is None:
        return None
    key, reasons, _ = entry
    value = str(section.get(key)).strip()
    if name == "SequenceEncoder" and value == "cascadernn" and section.get("with_linear"):
        return None
    detail = reasons.get(value)
    if detail is None:
        return None
    owner = "PaddleOCR's" if ecosystem == PADDLEOCR else "ppdet's"
    return (
        f"{owner} {name} with {key} {value!r} {detail}, so the safe variant would add nothing (it normalizes "
        f"{', '.join(SAFE_NECKS[(ecosystem, name)].normalizes)}, which this setting does not build unnormalized). "
        "For the rest of the model use ampsafe.patch(model) (FP32 islands where a scan finds them risky) and a loss-scale floor "
        "(`ampsafe run -- python tools/train.py ...`)"
    )


def ppdet_version() -> str | None:
    """The installed PaddleDetection's version: ``ppdet.__version__`` when ppdet is imported, else the
    distribution's metadata (without importing ppdet, which imports paddle); None when none is installed."""
    version = getattr(sys.modules.get("ppdet"), "__version__", None)
    if version:
        return str(version)
    for dist in ("paddledet", "ppdet"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def already_safe_reason(ecosystem: str, name: str) -> str | None:
    """Why ``name`` needs no safe variant (naming the ppdet in use for PaddleDetection); None when it is not one."""
    detail = ALREADY_SAFE.get((ecosystem, name))
    if detail is None:
        return None
    if ecosystem == PADDLEOCR:
        return (
            f"PaddleOCR's {name} {detail}, so it has no unnormalized path to its output and no safe variant is "
            "needed. For the rest of the model use ampsafe.patch(model) (FP32 islands where a scan finds them risky) "
            "and a loss-scale floor (`ampsafe run -- python tools/train.py ...`)"
        )
    version = ppdet_version()
    if name in TREE_ONLY:
        owner, source = "PaddleDetection's", " (measured on its 2024-10 tree; ppdet 2.6.0 has no such class)"
    elif version is None:
        # a source tree's ppdet (PaddleDetection's tools/ put it on sys.path) has no package metadata: the
        # version in use is unknown here, not absent
        owner, source = "ppdet's", f" (measured on {_READ_IN}; the ppdet in use has no version metadata)"
    else:
        owner, source = f"ppdet {version}'s", ""
    return (
        f"{owner} {name} {detail}{source}, so it has no unnormalized path to its output and no safe variant is "
        "needed. The float16 risk in these detectors is the head's final convs, which feed the loss unnormalized by "
        "design: protect them with ampsafe.patch(model) (FP32 islands where a scan finds them risky) and a "
        "loss-scale floor (`ampsafe run -- python tools/train.py ...` or ampsafe.paddle.GradScaler)"
    )


def not_covered_reason(ecosystem: str, name: str) -> str | None:
    """Why ``name`` has no safe variant though it may have an unnormalized path; None when it is not one of those."""
    why = NOT_COVERED.get((ecosystem, name))
    return None if why is None else f"{name} has no safe variant: {why}"


def _settings_note(ecosystem: str, name: str) -> str:
    entry = SETTING_SAFE.get((ecosystem, name))
    return "" if entry is None else f"; {entry[2]}"


def neck_table() -> list[tuple[str, str, str, str]]:
    """Every upstream neck class this registry knows, as (tree, neck, status, detail) rows sorted by tree and
    name: ``safe variant`` (detail: the variant and its new keys, and the settings already safe), ``already safe``
    or ``not covered`` (detail: why). tests/patches/test_neck_zoo.py checks that these are exactly the classes each
    tree registers."""
    rows = [
        (
            s.ecosystem,
            s.upstream,
            "safe variant",
            f"{s.name} (new keys: {s.new_keys}){_settings_note(s.ecosystem, s.upstream)}",
        )
        for s in SAFE_NECKS.values()
    ]
    rows += [(eco, name, "already safe", detail) for (eco, name), detail in ALREADY_SAFE.items()]
    rows += [(eco, name, "not covered", why) for (eco, name), why in NOT_COVERED.items()]
    return sorted(rows, key=lambda r: (r[0], r[1].lower()))


_TREES = {PADDLEOCR: "PaddleOCR", PADDLEDET: "PaddleDetection"}


def render_neck_table() -> str:
    """:func:`neck_table` as a Markdown table (``ampsafe swap-neck --list``)."""
    lines = ["| tree | neck | status | variant / why |", "|---|---|---|---|"]
    for eco, name, status, detail in neck_table():
        lines.append(f"| {_TREES[eco]} | {name} | {status} | {detail.replace('|', '/')} |")
    return "\n".join(lines)


def safe_neck(ecosystem: str, upstream: str) -> SafeNeck | None:
    return SAFE_NECKS.get((ecosystem, upstream))


def safe_names(ecosystem: str | None = None) -> set[str]:
    return {s.name for s in SAFE_NECKS.values() if ecosystem in (None, s.ecosystem)}


def supported(ecosystem: str) -> list[str]:
    """Upstream neck names with a safe variant, for error messages."""
    return sorted(s.upstream for s in SAFE_NECKS.values() if s.ecosystem == ecosystem)


def load_class(spec: SafeNeck):
    module, attr = spec.target.split(":")
    return getattr(importlib.import_module(module), attr)
