"""Run a callback just before or just after a named module executes, in a child process's ``sitecustomize``.

The bench shims (bench/ppocr_optin.py, bench/zoo_ppdet_shim.py) need it for the trees' own trainers: NumPy 2's
missing ``numpy.sctypes`` must be back before imgaug imports, and the trainers' scalers are wrapped once their
modules exist, without editing the trees.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

__all__ = ["install"]


class _RunAround(importlib.abc.MetaPathFinder):
    def __init__(self, before: dict, after: dict):
        self.before, self.after = dict(before), dict(after)

    def find_spec(self, name, path, target=None):
        if name not in self.before and name not in self.after:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        before, after = self.before.pop(name, None), self.after.pop(name, None)
        exec_module = spec.loader.exec_module

        def run(module):
            if before is not None:
                before()
            exec_module(module)
            if after is not None:
                after(module)

        spec.loader.exec_module = run
        return spec


def install(before: dict, after: dict) -> None:
    """``before``: module name -> a callback run before the module executes; ``after``: name -> a callback given
    the module once it has executed (at once for a module a ``sitecustomize`` that ran earlier already imported)."""
    pending = dict(after)
    for name in list(pending):
        if name in sys.modules:
            pending.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _RunAround(before, pending))
