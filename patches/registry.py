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


# where the classes are defined: Paddle code, in the Paddle package (ampsafe.patches.*_necks re-export them)
_OCR = "ampsafe.paddle.nets.paddleocr_necks"
_DET = "ampsafe.paddle.nets.ppdet_necks"

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
    )
}

# Upstream necks that were read (in ppdet 2.6.0's sources) and have no unnormalized conv: nothing to swap.
# name -> what builds each conv; already_safe_reason() words the refusal. tests/patches/test_ppdet.py checks
# that every conv of each, built by the installed ppdet, is a conv + norm block.
ALREADY_SAFE: dict[tuple[str, str], str] = {
    (PADDLEDET, name): detail
    for name, detail in (
        ("PPYOLOFPN", "darknet ConvBNLayer; SPP, CoordConv and the detection blocks included"),
        ("PPYOLOPAN", "darknet ConvBNLayer; SPP and the CSP blocks included"),
        ("PPYOLOTinyFPN", "darknet ConvBNLayer; SPP and the depthwise detection blocks included"),
        ("YOLOv3FPN", "darknet ConvBNLayer"),
        ("CustomCSPPAN", "PP-YOLOE's ConvBNLayer / RepVGG blocks; SPP included"),
    )
}
_READ_IN = "2.6.0"  # the ppdet whose sources ALREADY_SAFE was read from


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
    """Why ``name`` needs no safe variant, naming the installed ppdet; None when it is not one of those."""
    detail = ALREADY_SAFE.get((ecosystem, name))
    if detail is None:
        return None
    version = ppdet_version()
    if version is None:
        # a source tree's ppdet (PaddleDetection's tools/ put it on sys.path) has no package metadata: the
        # version in use is unknown here, not absent
        owner, source = "ppdet's", f"; read in ppdet {_READ_IN}'s sources; the ppdet in use has no version metadata"
    else:
        owner, source = f"ppdet {version}'s", ""
    return (
        f"{owner} {name} builds every conv as a conv + BatchNorm (+ activation) block ({detail}{source}), so it "
        "has no unnormalized path and no safe variant is needed. The float16 risk in these detectors is the "
        "head's final convs, which feed the loss unnormalized by design: protect them with ampsafe.patch(model) "
        "(FP32 islands where a scan finds them risky) and a loss-scale floor (`ampsafe run -- python "
        "tools/train.py ...` or ampsafe.paddle.GradScaler)"
    )


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
