"""Make the safe necks buildable by name in PaddleOCR and in PaddleDetection (this project's dbnet builder
finds them in :mod:`ampsafe.paddle.nets.paddleocr_necks`, where they are defined, with nothing registered).

PaddleOCR has no registry: ``ppocr.modeling.necks.build_neck`` checks a *local* ``support_dict`` list and
``eval``s the name among its local imports, and ``ppocr.modeling.architectures.base_model`` imported the
function by name. So the injection wraps ``build_neck`` (safe names built here, everything else delegated)
and rebinds it where it was imported, and also exposes the classes in the module namespace.

PaddleDetection registers classes by ``__name__`` in ``ppdet.core.workspace.global_config`` with a schema
read off ``__init__``'s signature; registering a name twice raises, so this checks first.
"""

from __future__ import annotations

import importlib
import sys

from ampsafe.errors import ConfigError

from . import registry
from .registry import PADDLEDET, PADDLEOCR

__all__ = [
    "register_paddleocr",
    "register_paddledet",
    "paddleocr_classes",
    "registered_in_ppocr",
    "ppocr_registration_line",
]


def paddleocr_classes() -> dict:
    """name -> class for every neck this package defines for PaddleOCR models (safe and upstream-compatible), which
    the dbnet builder reads without ppocr; the variants built on ppocr's own classes are added when registering."""
    from ampsafe.paddle.nets import paddleocr_necks as necks

    classes = {
        spec.name: registry.load_class(spec)
        for spec in registry.SAFE_NECKS.values()
        if spec.ecosystem == PADDLEOCR and not spec.upstream_class  # the others subclass ppocr's own classes
    }
    classes.update(DBFPN=necks.DBFPN, RSEFPN=necks.RSEFPN, LKPAN=necks.LKPAN)
    return classes


def _wrap_build_neck(original, classes: dict):
    if getattr(original, "_ampsafe_classes", None) is not None:
        original._ampsafe_classes.update(classes)
        return original

    def build_neck(config):
        name = config.get("name")
        if name in build_neck._ampsafe_classes:
            kwargs = {k: v for k, v in config.items() if k != "name"}
            config.pop("name")  # upstream pops it too
            return build_neck._ampsafe_classes[name](**kwargs)
        return original(config)

    build_neck._ampsafe_classes = dict(classes)
    build_neck.__wrapped__ = original
    build_neck.__doc__ = f"{original.__doc__ or ''}\n(ampsafe: also builds {', '.join(sorted(classes))})"
    return build_neck


def _loadable(ecosystem: str) -> dict:
    """name -> class of the variants built on an upstream class (:mod:`ampsafe.patches.normed_necks`) whose
    upstream class the ppocr / ppdet in use has (a neck added in a later release is skipped)."""
    classes = {}
    for spec in registry.SAFE_NECKS.values():
        if spec.ecosystem != ecosystem or not spec.upstream_class:
            continue
        module, attr = spec.upstream_class.split(":")
        try:
            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
        classes[spec.name] = registry.load_class(spec)
    return classes


def _register_ppocr(classes: dict) -> list[str] | None:
    try:
        import ppocr.modeling.necks as ppocr_necks
    except ImportError:
        return None
    safe = {n: c for n, c in classes.items() if n in registry.safe_names(PADDLEOCR)}
    safe.update(_loadable(PADDLEOCR))
    for name, cls in safe.items():
        setattr(ppocr_necks, name, cls)
        support = getattr(ppocr_necks, "support_dict", None)  # module-level in some forks
        if isinstance(support, list) and name not in support:
            support.append(name)
    wrapped = _wrap_build_neck(ppocr_necks.build_neck, safe)
    ppocr_necks.build_neck = wrapped
    for module_name in ("ppocr.modeling.architectures.base_model", "ppocr.modeling.architectures"):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            continue
        if getattr(module, "build_neck", None) is not None:
            module.build_neck = wrapped
    return sorted(safe)


def register_paddleocr() -> dict:
    """Register the safe necks in PaddleOCR when ``ppocr`` is importable. Idempotent. Returns what was
    registered (``{"ppocr": [...] or None}``; None: ppocr not importable). ampsafe's own dbnet builder needs no
    registration: it looks these necks up in :func:`paddleocr_classes` itself."""
    return {"ppocr": _register_ppocr(paddleocr_classes())}


def registered_in_ppocr() -> list[str] | None:
    """The safe necks PaddleOCR's own ``ppocr.modeling.necks.build_neck`` builds through ampsafe, read back
    from ppocr itself (``[]`` before :func:`register_paddleocr`); None when ``ppocr`` is not importable. Names
    registered only in the lab's DBNet builder (its dbnet workload) are never in it."""
    try:
        import ppocr.modeling.necks as ppocr_necks
    except ImportError:
        return None
    return sorted(getattr(ppocr_necks.build_neck, "_ampsafe_classes", None) or ())


def ppocr_registration_line(done: dict | None = None) -> str:
    """The line to print after :func:`register_paddleocr`: the safe necks in PaddleOCR's registry, read back
    from ppocr itself, or plainly that ppocr is not importable."""
    names = registered_in_ppocr()
    if names is None:
        return "safe necks registered (ppocr): none, PaddleOCR's ppocr package is not importable"
    return f"safe necks registered (ppocr): {', '.join(names) or 'none'}"


def register_paddledet() -> list[str]:
    """Register the safe ppdet necks in ``ppdet.core.workspace`` with their full schema (those built on an
    upstream class only when the ppdet in use has it). Idempotent; also correct when a config naming them was
    loaded first (its section is kept). Returns the names."""
    from ppdet.core import workspace
    from ppdet.core.config.schema import SchemaDict

    names = []
    generic = _loadable(PADDLEDET)
    for spec in registry.SAFE_NECKS.values():
        if spec.ecosystem != PADDLEDET or (spec.upstream_class and spec.name not in generic):
            continue
        cls = registry.load_class(spec)
        existing = workspace.global_config.get(cls.__name__)
        if isinstance(existing, SchemaDict):
            if getattr(existing, "pymodule", None) is not sys.modules[cls.__module__]:
                raise ConfigError(
                    f"ppdet already has a different class registered as {cls.__name__} "
                    f"(from {getattr(existing.pymodule, '__name__', '?')}); rename one of them"
                )
        else:
            loaded_first = existing  # a config with this section was merged before registration
            if loaded_first is not None:
                del workspace.global_config[cls.__name__]
            workspace.register(cls)
            if loaded_first:
                workspace.global_config[cls.__name__].update(loaded_first)
        names.append(cls.__name__)
    return names
