"""A post-import hook: run code right after a named module has executed, before its importers go on.

Why: ``ampsafe run`` patches a framework (its GradScaler spellings, its optimizers) the moment the script imports
it, so a torch script never pays for Paddle, and a library imported later (ppdet, torchvision's detection
models) is patched before the script sees it. A :class:`AfterImport` sits first on ``sys.meta_path`` only while
some module is awaited.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a named module has executed (its attributes exist, importers haven't run)."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module, _original=original_exec, _name=name):
            _original(module)
            for callback in self.pending.pop(_name, []):
                callback(module)

        loader.exec_module = exec_module
        return spec

    def when_imported(self, name: str, callback: Callable) -> None:
        """Call ``callback(module)`` now if ``name`` is imported, else right after it is."""
        module = sys.modules.get(name)
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
            callback(module)
            return
        self.pending.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def clear(self) -> None:
        """Drop every pending callback and leave ``sys.meta_path``."""
        self.pending.clear()
        if self in sys.meta_path:
            sys.meta_path.remove(self)
