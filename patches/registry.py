"""Which upstream neck has which AMP-safe variant: the one table the config swap and the registrations read.

Kept free of paddle/ppdet imports so that ``ampsafe swap-neck`` (a text rewrite) starts instantly; the classes
are named by ``module:attribute`` and imported only when something builds them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["SafeNeck", "SAFE_NECKS", "ALREADY_SAFE", "safe_neck", "safe_names", "supported", "load_class"]

PADDLEOCR = "paddleocr"
PADDLEDET = "paddledet"


@dataclass(frozen=True)
class SafeNeck:
    ecosystem: str  # "paddleocr" | "paddledet"
    upstream: str  # the neck name in upstream configs
    name: str  # the name the safe variant is registered / written under
    target: str  # "module:attribute" of the class
    new_keys: str  # the state_dict keys the variant adds (an upstream checkpoint lacks only these)


_OCR = "ampsafe.patches.paddleocr_necks"
_DET = "ampsafe.patches.ppdet_necks"

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
            PADDLEDET, "FPN", "AmpSafeFPN", f"{_DET}:AmpSafeFPN", "every conv becomes ConvNormLayer (.conv / .norm)"
        ),
    )
}

# Upstream necks that were read and have no unnormalized conv: nothing to swap (the reason is in the refusal;
# tests/patches/test_ppdet.py checks every conv of each, built by ppdet, is a conv + norm block).
ALREADY_SAFE: dict[tuple[str, str], str] = {
    (PADDLEDET, name): (
        f"ppdet 2.6.0's {name} builds every conv as a conv + BatchNorm (+ activation) block ({detail}), so it has "
        "no unnormalized path and no safe variant is needed. The float16 risk in these detectors is the head's "
        "final convs, which feed the loss unnormalized by design: protect them with ampsafe.patch(model) (FP32 "
        "islands where a scan finds them risky) and a loss-scale floor (`ampsafe run -- python tools/train.py ...` "
        "or ampsafe.paddle.GradScaler)"
    )
    for name, detail in (
        ("PPYOLOFPN", "darknet ConvBNLayer; SPP, CoordConv and the detection blocks included"),
        ("PPYOLOPAN", "darknet ConvBNLayer; SPP and the CSP blocks included"),
        ("PPYOLOTinyFPN", "darknet ConvBNLayer; SPP and the depthwise detection blocks included"),
        ("YOLOv3FPN", "darknet ConvBNLayer"),
        ("CustomCSPPAN", "PP-YOLOE's ConvBNLayer / RepVGG blocks; SPP included"),
    )
}


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
