"""AMP-safe variants of upstream necks made by one rule: the upstream class, and after its ``__init__`` a fresh
normalization after each of its unnormalized convs and ``nn.Linear`` layers (:func:`normalize_layers`).

Why one rule instead of a hand-written class per neck: the unnormalized necks of PaddleOCR and PaddleDetection
(FCEFPN, FPN_UNet, CLRFPN, HRFPN, PRENFPN...) share one problem, convs or linears whose outputs reach the neck's
output with no normalization after them, and one fix, a normalization after each such layer. The variant is a
subclass of the upstream class (built from the tree in use: ``ppocr`` / ``ppdet``), so its constructor arguments, its
forward and every upstream ``state_dict`` key are upstream's. Each normalized conv becomes ampsafe's ``convbn`` layer
(:class:`~ampsafe.policies.convbn.ConvBNLayer`: the conv's class swapped, its parameters untouched), whose new
BatchNorm is its child ``<conv>.bn`` (new keys ``<conv>.bn.weight``, ``.bias``, ``._mean``, ``._variance``: BN_KEYS);
each normalized linear a :class:`LinearNormLayer` (the same swap), whose new LayerNorm is its child
``<linear>.norm`` (new keys ``<linear>.norm.weight``, ``.bias``: LN_KEYS). An upstream checkpoint therefore loads
with only those keys missing (:func:`added_keys`).

Why a LayerNorm after a linear rather than a ``BatchNorm1D``: the linears of these necks (PRENFPN's graph convs,
SequenceEncoder's ``fc`` and cascade linears) act on the last axis of a ``[batch, length, features]`` sequence, the
axis a LayerNorm normalizes as it is (any rank, no ``data_format``), each position on its own, so the statistics do
not depend on the batch size or on the other positions of a line; a BatchNorm1D needs ``data_format="NLC"`` and mixes
batch and length. Measured on PaddleOCR's SPIN config (rec_r32_gaspin_bilstm_att.yml, cascade with_linear) under its
tools/train.py, AMP O2 (float16 emulated), ``ampsafe run``, batch 2, 4 steps from scale 1024: with a BatchNorm1D
after the linears the first three steps overflowed (scale 1024 -> 128), with a LayerNorm the first one (-> 512);
upstream's neck, none. What a BatchNorm would have kept: a fresh one is the identity in eval mode, so an upstream
checkpoint evaluates as upstream's until it is trained; a LayerNorm changes the outputs from the first step. Paddle
keeps LayerNorm in float32 (O1 black list; O2's ``decorate`` keeps its weights float32 for float16).

Which layers: those whose sublayer path matches one of the spec's ``normalizes`` patterns
(:data:`ampsafe.patches.registry.SAFE_NECKS`), except one that already sits in a layer + norm block of its kind (a
config that sets the neck's ``norm_type`` builds those): it is left as it is. tests/patches/test_neck_zoo.py checks
that the patterns name exactly the layers :func:`ampsafe.patches.neck_check.check_neck` finds unnormalized. A
pattern that matches nothing at a setting changes nothing there (SequenceEncoder's variant normalizes ``encoder.fc``
and the cascade's linears; built with ``encoder_type`` 'rnn', 'reshape' or 'svtr' it is upstream's class and nothing
more).

The classes are built on first use (module ``__getattr__``) under their registered name, with ``__module__`` this
module, so ``pickle`` and ``copy.deepcopy`` find them again; their ``__init__`` carries the upstream signature,
which ppdet reads for its config schema.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import sys

from ampsafe.core.swaps import protection_of, swap
from ampsafe.policies.convbn import ConvBNLayer

from . import registry

__all__ = [
    "normalize_layers",
    "in_conv_norm_block",
    "in_norm_block",
    "LinearNormLayer",
    "added_keys",
    "variant_class",
    "generic_specs",
    "BN_KEYS",
    "LN_KEYS",
]


def _backend():
    """Paddle's Backend, imported when a neck is built (importing this module needs no framework)."""
    from ampsafe.paddle.backend import BACKEND

    return BACKEND


BN_KEYS = ("weight", "bias", "_mean", "_variance")  # the keys of the BatchNorm after a normalized conv: <conv>.bn.*
LN_KEYS = ("weight", "bias")  # the keys of the LayerNorm after a normalized linear: <linear>.norm.*


class LinearNormLayer(ConvBNLayer):
    """ampsafe's convbn treatment for an ``nn.Linear``: linear, then ``self.norm``, a LayerNorm over the output
    features (the last axis; see the module doc for why not a BatchNorm)."""

    _ampsafe_attrs = ("norm",)

    def forward(self, *args, **kwargs):
        return self.norm(self._ampsafe_base.forward(self, *args, **kwargs))


def _linear_norm(linear):
    """A fresh LayerNorm over the linear's output features, in the linear's train mode."""
    from paddle import nn

    norm = nn.LayerNorm(linear.weight.shape[1])
    norm.train() if linear.training else norm.eval()
    return norm


def added_keys(variant) -> set[str]:
    """The ``state_dict`` keys a variant has that its upstream class has not: the new norm's, per normalized layer."""
    layers = dict(variant.named_sublayers())
    return {
        f"{path}.norm.{k}" if isinstance(layers[path], LinearNormLayer) else f"{path}.bn.{k}"
        for path in variant.ampsafe_normalized
        for k in (LN_KEYS if isinstance(layers[path], LinearNormLayer) else BN_KEYS)
    }


def in_norm_block(parent, name: str, kinds: tuple) -> bool:
    """``parent.<name>`` is the one layer of ``kinds`` in a layer + norm block: its parent holds exactly one
    layer of ``kinds`` and a norm."""
    children = dict(parent.named_children())
    found = [c for c in children.values() if isinstance(c, kinds)]
    return len(found) == 1 and any(isinstance(c, _backend().swaps.norms) for c in children.values())


def in_conv_norm_block(parent, name: str) -> bool:
    """``parent.<name>`` is the conv of a conv + norm block: its parent holds exactly one conv and a norm."""
    return in_norm_block(parent, name, _backend().swaps.convs)


def normalize_layers(layer, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """Follow every conv and ``nn.Linear`` of ``layer`` whose path matches one of ``patterns`` (fnmatch) with a
    fresh normalization: ampsafe's convbn swap for a conv (new keys ``<conv>.bn.*``), :class:`LinearNormLayer` for a
    linear (new keys ``<linear>.norm.*``). Layers already in a layer + norm block of their kind, or already patched, are left alone.
    Returns the paths normalized."""
    from paddle import nn

    swaps = _backend().swaps
    parents = {
        id(child): (parent, name) for parent in [layer, *layer.sublayers()] for name, child in parent.named_children()
    }
    done = []
    for path, sub in list(layer.named_sublayers()):
        kinds = swaps.convs if isinstance(sub, swaps.convs) else (nn.Linear,) if isinstance(sub, nn.Linear) else None
        if kinds is None or protection_of(sub) or not any(fnmatch.fnmatchcase(path, p) for p in patterns):
            continue
        if in_norm_block(*parents[id(sub)], kinds):
            continue
        if kinds is swaps.convs:
            swap(sub, ConvBNLayer, bn=swaps.new_batch_norm(sub), act=None)
        else:
            swap(sub, LinearNormLayer, norm=_linear_norm(sub))
        done.append(path)
    return tuple(done)


def _import(target: str):
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def variant_class(spec: registry.SafeNeck) -> type:
    """The AMP-safe subclass of ``spec.upstream_class`` (imported from the ppocr / ppdet in use)."""
    base = _import(spec.upstream_class)
    patterns = tuple(spec.normalizes)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self.ampsafe_normalized = normalize_layers(self, patterns)

    __init__.__signature__ = inspect.signature(base.__init__)  # ppdet's schema: getfullargspec reads it
    __init__.__qualname__ = f"{spec.name}.__init__"
    namespace = {
        "__init__": __init__,
        "__module__": __name__,
        "__qualname__": spec.name,
        "__doc__": (
            f"{base.__name__} ({spec.upstream_class}) with a norm after each of its unnormalized convs / linears "
            f"(new keys: {spec.new_keys}); everything else is upstream's."
        ),
        "protection": "convbn",
        "ampsafe_patterns": patterns,
    }
    return type(spec.name, (base,), namespace)


def generic_specs(ecosystem: str | None = None) -> list[registry.SafeNeck]:
    """The registry's variants built here (rather than hand-written), of one ecosystem or all."""
    return [
        s
        for s in registry.SAFE_NECKS.values()
        if s.target.startswith(f"{__name__}:") and ecosystem in (None, s.ecosystem)
    ]


def __getattr__(name: str):
    spec = next((s for s in generic_specs() if s.name == name), None)
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = variant_class(spec)
    setattr(sys.modules[__name__], name, cls)
    return cls
