"""Which module's forward is running right now: global forward pre/post hooks keep a module stack.

Global hooks (``register_module_forward_pre_hook``) see every ``Module.__call__`` without touching the
model's own hook dicts, so nothing is left on the model afterwards, and ``always_call=True`` pops the stack
even when a forward raises. Modules that are not part of the model (a loss module built on the fly) are
attributed to the enclosing model module.

    with module_stack(backend.modules(model)):
        model(x)              # inside: current_module() -> "layer1.0.conv1"
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

__all__ = ["module_stack", "current_module", "current_module_object"]

_local = threading.local()


def _contexts() -> list:
    ctxs = getattr(_local, "contexts", None)
    if ctxs is None:
        ctxs = _local.contexts = []
    return ctxs


class _Stack:
    """One ``module_stack`` context: module -> path, and the stack of (path, module) being run."""

    def __init__(self, paths: dict):
        self.names = {m: name for name, m in paths.items()}
        self.frames: list[tuple[str, object]] = []

    def push(self, module) -> None:
        name = self.names.get(module)
        if name is None:  # not the model's: attribute its ops to the caller
            self.frames.append(self.frames[-1] if self.frames else ("", None))
        else:
            self.frames.append((name, module))

    def pop(self) -> None:
        if self.frames:
            self.frames.pop()


def current_module() -> str:
    """Path of the innermost running module of the innermost ``module_stack`` ("" at the root or outside)."""
    ctxs = _contexts()
    if not ctxs or not ctxs[-1].frames:
        return ""
    return ctxs[-1].frames[-1][0]


def current_module_object():
    """The innermost running module itself, or None outside any module."""
    ctxs = _contexts()
    if not ctxs or not ctxs[-1].frames:
        return None
    return ctxs[-1].frames[-1][1]


@contextmanager
def module_stack(paths: dict):
    """Track the running module of a model for the duration of the block; removes its hooks on exit. ``paths``: the
    model's modules by path, as its Backend's ``modules(model)`` maps them."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    stack = _Stack(paths)
    thread = threading.get_ident()

    def pre(module, args):
        if threading.get_ident() == thread:
            stack.push(module)

    def post(module, args, output):
        if threading.get_ident() == thread:
            stack.pop()

    ctxs = _contexts()
    ctxs.append(stack)
    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True)]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()
        ctxs.remove(stack)
