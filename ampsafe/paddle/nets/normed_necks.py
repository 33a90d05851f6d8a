"""AMP-safe variants of upstream necks made by one rule: the upstream class, and after its ``__init__`` a fresh
BatchNorm after each of its unnormalized convs and ``nn.Linear`` layers (:func:`normalize_layers`).

Why one rule instead of a hand-written class per neck: the unnormalized necks of PaddleOCR and PaddleDetection
(FCEFPN, FPN_UNet, CLRFPN, HRFPN, PRENFPN...) share one problem, convs or linears whose outputs reach the neck's
output with no normalization after them, and one fix, a BatchNorm after each such layer. The variant is a subclass
of the upstream class (built from the tree in use: ``ppocr`` / ``ppdet``), so its constructor arguments, its forward
and every upstream ``state_dict`` key are upstream's. Each normalized conv becomes ampsafe's ``convbn`` layer
(:class:`~ampsafe.policies.convbn.ConvBNLayer`: the conv's class swapped, its parameters untouched), each normalized
linear a :class:`LinearBNLayer` (the same swap); the new BatchNorm is the layer's child ``<layer>.bn`` (new keys
``<layer>.bn.weight``, ``.bias``, ``._mean``, ``._variance``). An upstream checkpoint therefore loads with only those
keys missing.

Why a BatchNorm after a linear, and over its last axis (``BatchNorm1D(out_features, data_format="NLC")``): the
linears of these necks (PRENFPN's graph convs, SequenceEncoder's ``fc`` and cascade linears) act on the last axis
of a ``[batch, length, features]`` sequence, so each output feature is normalized over batch and length, as a conv's
BatchNorm normalizes each channel over batch and space. A LayerNorm would normalize each position over its features
instead; the BatchNorm is chosen because it is the convs' rule (the same keys, ``BN_KEYS``; Paddle keeps it float32
under O2's ``decorate``) and because a fresh one (mean 0, variance 1, weight 1, bias 0) is the identity in eval mode,
up to its epsilon: an upstream checkpoint loaded into the variant evaluates as upstream's until it is trained again.
A LayerNorm changes the outputs from the first step.

Which layers: those whose sublayer path matches one of the spec's ``normalizes`` patterns
(:data:`ampsafe.patches.registry.SAFE_NECKS`), except one that already sits in a layer + norm block (a config
that sets the neck's ``norm_type`` builds those): it is left as it is. tests/patches/test_neck_zoo.py checks that
the patterns name exactly the layers :func:`ampsafe.paddle.nets.neck_check.check_neck` finds unnormalized. A pattern
that matches nothing at a setting changes nothing there (SequenceEncoder's variant normalizes ``encoder.fc`` and the
cascade's linears; built with ``encoder_type`` 'rnn', 'reshape' or 'svtr' it is upstream's class and nothing more).

The classes are built on first use (module ``__getattr__``) under their registered name, with ``__module__`` this
module, so ``pickle`` and ``copy.deepcopy`` find them again; their ``__init__`` carries the upstream signature,
which ppdet reads for its config schema.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import sys

from paddle import nn

from ampsafe.patches import registry

from ...core.swaps import protection_of, swap
from ...policies.convbn import ConvBNLayer
from ..backend import BACKEND

__all__ = [
    "normalize_layers",
    "in_conv_norm_block",
    "in_norm_block",
    "LinearBNLayer",
    "variant_class",
    "generic_specs",
    "BN_KEYS",
]

BN_KEYS = ("weight", "bias", "_mean", "_variance")  # the keys of the BatchNorm after a normalized layer: <layer>.bn.*


class LinearBNLayer(ConvBNLayer):
    """ampsafe's convbn layer for an ``nn.Linear``: linear, then ``self.bn``, a ``BatchNorm1D`` over the last axis
    (see the module doc). Outputs of more than three axes have their middle axes folded into one for the norm."""

    _ampsafe_attrs = ("bn",)

    def forward(self, *args, **kwargs):
        out = self._ampsafe_base.forward(self, *args, **kwargs)
        if out.ndim > 3:  # BatchNorm1D takes [N, C] and [N, L, C]
            return self.bn(out.flatten(1, -2)).reshape(out.shape)
        return self.bn(out)


def _linear_batch_norm(linear) -> nn.Layer:
    """A fresh ``BatchNorm1D`` over the linear's output features (the last axis), in the linear's train mode."""
    bn = nn.BatchNorm1D(linear.weight.shape[1], data_format="NLC")
    bn.train() if linear.training else bn.eval()
    return bn


def in_norm_block(parent, name: str, kinds: tuple) -> bool:
    """``parent.<name>`` is the one layer of ``kinds`` in a layer + norm block: its parent holds exactly one
    layer of ``kinds`` and a norm."""
    children = dict(parent.named_children())
    found = [c for c in children.values() if isinstance(c, kinds)]
    return len(found) == 1 and any(isinstance(c, BACKEND.swaps.norms) for c in children.values())


def in_conv_norm_block(parent, name: str) -> bool:
    """``parent.<name>`` is the conv of a conv + norm block: its parent holds exactly one conv and a norm."""
    return in_norm_block(parent, name, BACKEND.swaps.convs)


def normalize_layers(layer, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """Follow every conv and ``nn.Linear`` of ``layer`` whose path matches one of ``patterns`` (fnmatch) with a
    fresh BatchNorm: ampsafe's convbn swap for a conv, :class:`LinearBNLayer` for a linear (new keys
    ``<layer>.bn.*``). Layers already in a layer + norm block of their kind, or already patched, are left alone.
    Returns the paths normalized."""
    swaps = BACKEND.swaps
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
            swap(sub, LinearBNLayer, bn=_linear_batch_norm(sub))
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
            f"{base.__name__} ({spec.upstream_class}) with a BatchNorm after each of its unnormalized convs / linears "
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
