"""Module attributes read from another module on first use: names whose defining module imports a framework.

Why: ``import ampsafe.patches`` and ``import ampsafe.workloads.dbnet`` must not import paddle (``ampsafe swap-neck``
edits a YAML file; ``import ampsafe`` stays light), yet their public names are Paddle classes defined in
``ampsafe.paddle.nets``. A module-level ``__getattr__`` (PEP 562) imports the defining module the first time one
of them is read and caches the value in the module, so later reads are plain attribute reads.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable

__all__ = ["lazy_attributes"]


def lazy_attributes(
    module_name: str, source: str, names: Iterable[str], *, any_public: bool = False
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for module ``module_name``: each of ``names`` (with ``any_public``, any name
    not starting with ``_``) is read from module ``source`` on first use. Private and dunder names are never
    forwarded, so probes such as ``__path__`` do not import ``source``."""
    names = tuple(names)

    def __getattr__(name: str):
        if name.startswith("_") or (not any_public and name not in names):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module_name])) | set(names))

    return __getattr__, __dir__
