"""Module attributes read from another module on first use: names whose defining module imports a framework.

Why: ``import ampsafe``, ``import ampsafe.torch`` and the lab's ``workloads.dbnet`` must stay light (no torch,
no paddle, none of the scan or heal machinery) yet offer their public names, which are defined in modules that
import a framework. A module-level ``__getattr__`` (PEP 562) imports the defining module the first time one of
them is read and caches the value in the module, so later reads are plain attribute reads. Every package
``__init__`` that offers such names builds its ``__getattr__`` / ``__dir__`` here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_attributes"]


def lazy_attributes(
    module_name: str,
    source: str | Mapping[str, str],
    names: Iterable[str] = (),
    *,
    any_public: bool = False,
    submodules: Iterable[str] = (),
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for module ``module_name``.

    ``source``: the module every name is read from, or a map name -> its module (``".scaler"`` is relative to
    ``module_name``). ``names``: the names read from a single ``source`` (with ``any_public``, any name not
    starting with ``_``). ``submodules``: names that are ``module_name``'s own submodules, imported when read.
    Private and dunder names are never forwarded, so probes such as ``__path__`` import nothing."""
    sources = dict(source) if isinstance(source, Mapping) else dict.fromkeys(names, source)
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{module_name}.{name}")
        if name.startswith("_") or (name not in sources and not (any_public and isinstance(source, str))):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources.get(name, source), module_name), name)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module_name])) | set(sources))

    return __getattr__, __dir__
