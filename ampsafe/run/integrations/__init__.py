"""``ampsafe run --emulate-fp16`` for trainers that choose AMP from the device type: one small module each.

On a machine without CUDA, ``--emulate-fp16`` makes ``torch.autocast("cuda")`` CPU float16 autocast with CUDA's
op lists and ``GradScaler("cuda")`` a scaling CPU scaler (:mod:`ampsafe.torch.cuda_emulation`). A trainer that
never asks for "cuda" on a CPU never reaches them: accelerate keeps ``native_amp=False``, Lightning rewrites
``16-mixed`` to ``bf16-mixed``, mmengine's ``AmpOptimWrapper`` asserts a GPU, ultralytics' ``check_amp``
returns False. Each module here changes that one decision, so the framework takes its own GPU float16 path
(its autocast, its ``GradScaler("cuda")``, which ``ampsafe run`` has made ampsafe's) with tensors on the CPU;
``torch.cuda.is_available()`` is never faked (the frameworks would move tensors to CUDA).

Each module has ``TARGET`` (the module whose import installs it), ``KNOWN`` (the attributes it patches) and
``install(module, set_attr, tell) -> str``: ``set_attr(owner, name, value)`` patches one attribute (restored by
``ampsafe.auto.uninstall``), ``tell(line)`` puts a line in the banner when the integration acts (each time a
trainer takes the emulated path). A version whose attributes differ gets one warning line, never an error.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from .active import emulating

__all__ = ["NAMES", "targets", "apply", "emulating"]

NAMES = ("accelerate", "lightning", "mmengine", "ultralytics")  # the keys of _integrations(), in order


def _integrations() -> dict[str, ModuleType]:
    """Name -> integration module: the registry, one import per trainer (none imports its trainer)."""
    from . import accelerate, lightning, mmengine, ultralytics

    return {"accelerate": accelerate, "lightning": lightning, "mmengine": mmengine, "ultralytics": ultralytics}


def targets() -> list[tuple[str, str]]:
    """(integration, module whose import installs it) pairs, for ``ampsafe.auto``'s post-import hooks."""
    return [(name, target) for name, module in _integrations().items() for target in module.TARGETS]


def apply(name: str, module, set_attr: Callable, tell: Callable[[str], None]) -> str:
    """Install integration ``name`` on the imported framework ``module``; the line saying what it patched, or a
    warning line when the framework's version lacks what the integration patches."""
    integration = _integrations()[name]
    missing = [attr for attr in integration.KNOWN.get(module.__name__, ()) if _lookup(module, attr) is None]
    version = _version(module.__name__)
    if missing:
        return (
            f"warning: --emulate-fp16 {name} integration not installed: {module.__name__} {version} has no "
            f"{', '.join(missing)} (a version it does not know); that trainer's AMP stays as the framework decides"
        )
    try:
        return integration.install(module, set_attr, tell)
    except Exception as exc:  # noqa: BLE001 - an unknown version: one warning line, training goes on
        return (
            f"warning: --emulate-fp16 {name} integration not installed on {module.__name__} {version} "
            f"({type(exc).__name__}: {exc}); that trainer's AMP stays as the framework decides"
        )


def _lookup(module, dotted: str):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _version(module_name: str) -> str:
    from importlib import metadata

    top = module_name.split(".")[0]
    for dist in (top, top.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(version unknown)"
