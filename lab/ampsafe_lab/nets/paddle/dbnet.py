"""DBNet, and the small registry that builds it from a PaddleOCR ``Architecture`` section.

Parts are looked up by name, the way PaddleOCR's own ``build_neck`` looks them up: the registries here, those
added with ``register_neck(name, cls)``, then every PaddleOCR neck :mod:`.paddleocr_necks` defines (the AMP-safe
ones :mod:`ampsafe.patches` ships and the upstream-compatible RSEFPN/LKPAN), so a swapped config builds here with
nothing registered. Each part is called as PaddleOCR calls it:
``cls(in_channels=<previous part's out_channels>, **section_without_name)`` and must set ``out_channels``.
The ``dbnet`` workload (:mod:`ampsafe_lab.workloads.dbnet`) re-exports these names without importing paddle itself.
"""

from __future__ import annotations

from typing import Any

from paddle import nn

from ampsafe.errors import ConfigError
from ampsafe.paddle.nets.paddleocr_necks import DBFPN, PADDLEOCR_NECKS

from .backbones import MobileNetV3, ResNet_vd
from .heads import DBHead
from .loss import DBLoss

__all__ = [
    "BACKBONES",
    "NECKS",
    "HEADS",
    "register_backbone",
    "register_neck",
    "register_head",
    "DBNet",
    "build_model",
    "build_loss",
]

BACKBONES: dict[str, type] = {"MobileNetV3": MobileNetV3, "ResNet_vd": ResNet_vd}
NECKS: dict[str, type] = {"DBFPN": DBFPN}
HEADS: dict[str, type] = {"DBHead": DBHead}


def _register(registry: dict, kind: str, name: str, cls: type) -> type:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a {kind} name must be a non-empty string, got {name!r}")
    if not callable(cls):
        raise ConfigError(f"{kind} {name!r} must be a class (or factory), got {cls!r}")
    registry[name] = cls
    return cls


def register_backbone(name: str, cls: type) -> type:
    return _register(BACKBONES, "backbone", name, cls)


def register_neck(name: str, cls: type) -> type:
    """Make ``Neck: {name: <name>}`` buildable; ``cls(in_channels=list, **kwargs)`` with ``.out_channels``."""
    return _register(NECKS, "neck", name, cls)


def register_head(name: str, cls: type) -> type:
    return _register(HEADS, "head", name, cls)


class DBNet(nn.Layer):
    """PaddleOCR's BaseModel for DB: ``backbone`` -> ``neck`` -> ``head``; returns the head's ``{"maps": ...}``."""

    def __init__(self, backbone: nn.Layer, neck: nn.Layer, head: nn.Layer):
        super().__init__()
        self.backbone = backbone
        self.neck = neck
        self.head = head

    def forward(self, x, data=None):
        return self.head(self.neck(self.backbone(x)), targets=data)


def _necks() -> dict[str, type]:
    """The necks a config may name: every PaddleOCR neck in :mod:`.paddleocr_necks`, this builder's own winning."""
    return {**PADDLEOCR_NECKS, **NECKS}


def _build_part(registry: dict, kind: str, section: Any, in_channels) -> nn.Layer:
    if not isinstance(section, dict) or "name" not in section:
        raise ConfigError(f"Architecture.{kind} must be a mapping with a 'name', got {section!r}")
    options = {k: v for k, v in section.items() if k != "name"}
    name = section["name"]
    if name not in registry:
        raise ConfigError(
            f"Architecture.{kind} name {name!r} is not registered; known: {', '.join(sorted(registry))} "
            f"(register more with ampsafe_lab.workloads.dbnet.register_{kind.lower()})"
        )
    if kind == "Backbone":  # image channels may come from the config; later parts take their producer's
        options.setdefault("in_channels", in_channels)
    else:
        options["in_channels"] = in_channels
    for unused in ("pretrained", "pretrained_model", "checkpoints"):
        options.pop(unused, None)
    try:
        part = registry[name](**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"Architecture.{kind} {name!r} cannot be built from {options}: {err}") from err
    if not hasattr(part, "out_channels") and kind != "Head":
        raise ConfigError(f"Architecture.{kind} {name!r} built a layer without .out_channels")
    return part


def build_model(arch: dict) -> DBNet:
    """Build the DBNet an ``Architecture`` section describes (``model_type: det``, ``algorithm: DB``)."""
    if not isinstance(arch, dict):
        raise ConfigError(f"Architecture must be a mapping, got {type(arch).__name__}")
    if arch.get("model_type", "det") != "det" or arch.get("algorithm", "DB") not in ("DB", "DB++"):
        raise ConfigError(
            f"only det/DB architectures are supported, got model_type={arch.get('model_type')!r} "
            f"algorithm={arch.get('algorithm')!r}"
        )
    if arch.get("Transform"):
        raise ConfigError("Architecture.Transform is not supported (DB configs leave it empty)")
    backbone = _build_part(BACKBONES, "Backbone", arch.get("Backbone"), 3)
    neck = _build_part(_necks(), "Neck", arch.get("Neck"), backbone.out_channels)
    head = _build_part(HEADS, "Head", arch.get("Head"), neck.out_channels)
    return DBNet(backbone, neck, head)


def build_loss(section: dict) -> DBLoss:
    """Build DBLoss from a ``Loss`` section (other loss names are refused)."""
    if not isinstance(section, dict) or section.get("name") != "DBLoss":
        raise ConfigError(f"Loss must be a mapping with name: DBLoss, got {section!r}")
    options = {k: v for k, v in section.items() if k != "name"}
    try:
        return DBLoss(**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"Loss DBLoss cannot be built from {options}: {err}") from err
