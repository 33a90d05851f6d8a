"""AMP-safe variants of upstream necks made by one rule: the upstream class, and after its ``__init__`` a fresh
BatchNorm after each of its unnormalized convs (:func:`normalize_convs`).

Why one rule instead of a hand-written class per neck: the unnormalized necks of PaddleOCR and PaddleDetection
(FCEFPN, FPN_UNet, CLRFPN, HRFPN...) share one problem, convs whose outputs reach the neck's output with no
normalization after them, and one fix, a BatchNorm after each such conv. The variant is a subclass of the
upstream class (built from the tree in use: ``ppocr`` / ``ppdet``), so its constructor arguments, its forward and
every upstream ``state_dict`` key are upstream's; each normalized conv becomes ampsafe's ``convbn`` layer
(:class:`~ampsafe.policies.convbn.ConvBNLayer`: the conv's class swapped, its parameters untouched), whose new
BatchNorm is the conv's child ``<conv>.bn`` (new keys ``<conv>.bn.weight``, ``.bias``, ``._mean``,
``._variance``). An upstream checkpoint therefore loads with only those keys missing.

Which convs: those whose sublayer path matches one of the spec's ``normalizes`` patterns
(:data:`ampsafe.patches.registry.SAFE_NECKS`), except a conv that already sits in a conv + norm block (a config
that sets the neck's ``norm_type`` builds those): it is left as it is. tests/patches/test_neck_zoo.py checks that
the patterns name exactly the convs :func:`ampsafe.patches.neck_check.check_neck` finds unnormalized.

The classes are built on first use (module ``__getattr__``) under their registered name, with ``__module__`` this
module, so ``pickle`` and ``copy.deepcopy`` find them again; their ``__init__`` carries the upstream signature,
which ppdet reads for its config schema.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import sys

from ampsafe.patches import registry

from ...core.swaps import protection_of, swap
from ...policies.convbn import ConvBNLayer
from ..backend import BACKEND

__all__ = ["normalize_convs", "in_conv_norm_block", "variant_class", "generic_specs", "BN_KEYS"]

BN_KEYS = ("weight", "bias", "_mean", "_variance")  # the keys of the BatchNorm after a normalized conv: <conv>.bn.*


def in_conv_norm_block(parent, name: str) -> bool:
    """``parent.<name>`` is the conv of a conv + norm block: its parent holds exactly one conv and a norm."""
    swaps = BACKEND.swaps
    children = dict(parent.named_children())
    convs = [c for c in children.values() if isinstance(c, swaps.convs)]
    return len(convs) == 1 and any(isinstance(c, swaps.norms) for c in children.values())


def normalize_convs(layer, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """Follow every conv of ``layer`` whose path matches one of ``patterns`` (fnmatch) with a fresh BatchNorm,
    ampsafe's convbn swap (new keys ``<conv>.bn.*``). Convs already in a conv + norm block, or already patched,
    are left alone. Returns the paths normalized."""
    swaps = BACKEND.swaps
    parents = {
        id(child): (parent, name) for parent in [layer, *layer.sublayers()] for name, child in parent.named_children()
    }
    done = []
    for path, sub in list(layer.named_sublayers()):
        if (
            not isinstance(sub, swaps.convs)
            or protection_of(sub)
            or not any(fnmatch.fnmatchcase(path, p) for p in patterns)
        ):
            continue
        parent, name = parents[id(sub)]
        if in_conv_norm_block(parent, name):
            continue
        swap(sub, ConvBNLayer, bn=swaps.new_batch_norm(sub), act=None)
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
        self.ampsafe_normalized = normalize_convs(self, patterns)

    __init__.__signature__ = inspect.signature(base.__init__)  # ppdet's schema: getfullargspec reads it
    __init__.__qualname__ = f"{spec.name}.__init__"
    namespace = {
        "__init__": __init__,
        "__module__": __name__,
        "__qualname__": spec.name,
        "__doc__": (
            f"{base.__name__} ({spec.upstream_class}) with a BatchNorm after each of its unnormalized convs "
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
