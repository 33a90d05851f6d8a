"""Per-instance forward hooks that live outside the module: nothing to pickle, nothing a copy carries.

Why: a hook registered with ``module.register_forward_pre_hook`` is an entry of ``module._forward_pre_hooks``,
so it travels with the module. ``torch.save(model)`` pickles it (a closure or bound method of ampsafe's cannot
be pickled, and one that can would make the checkpoint need ampsafe to load), and ``copy.deepcopy(model)`` gives
the copy the same function, so an EMA copy or a checkpoint copy (ultralytics deep-copies its model every epoch)
keeps feeding the live model's capture.

Here the hooks are kept in a registry keyed by the module's identity, and the module's *class* gets a
``__call__`` that looks the instance up (one dict lookup per call of that class; other instances, copies
included, pass straight through). That class attribute is patched through the process ledger
(:mod:`ampsafe.core.ledger`, party ``"ampsafe.torch.callhooks"``), which puts it back when the class's last
hooked instance is released, also when another party patched the same ``__call__`` since. A pickle of the module
holds no trace of ampsafe; a deep copy is another instance, so it is not hooked.

The registry holds the module weakly, and a hook that is a bound method (``capture._record``) weakly too: the
hook goes when its object does. So a model whose hook's object holds it (an input capture's ``model``) is freed
once its users drop it and that object, and its class's ``__call__`` is put back then. Whoever hooks a bound
method keeps its object alive for as long as the hook should fire.

    handle = pre_hook(model, lambda args, kwargs: ...)   # before each model(...) call
    handle = post_hook(model, lambda: ...)                # after each call, also when the forward raised
    handle.remove()
"""

from __future__ import annotations

import threading
import weakref
from types import MethodType
from typing import Any, Callable

from ..core.ledger import AttrPatches

__all__ = ["pre_hook", "post_hook", "hooked", "TOP_CALLS"]

# id(module) -> [weakref(module), {key: pre fn}, {key: post fn}]
_hooks: dict[int, list] = {}
_patches = AttrPatches("ampsafe.torch.callhooks")  # each hooked class's __call__, while it has hooked instances
_lock = _patches.lock  # the ledger's own: a released module's weakref callback may run while a thread holds it
_users: dict[type, int] = {}  # hooked class -> how many of its instances are hooked now
_keys = iter(range(1 << 62))


class _Handle:
    """``remove()`` detaches one hook (idempotent); a handle can be pickled or copied as a no-op."""

    def __init__(self, module, key: int) -> None:
        self._id, self._key, self._cls = id(module), key, type(module)

    def remove(self) -> None:
        with _lock:
            entry = _hooks.get(self._id)
            if entry is None or (entry[1].pop(self._key, None) is None and entry[2].pop(self._key, None) is None):
                return
            if not entry[1] and not entry[2]:
                del _hooks[self._id]
                _release(self._cls)

    def __reduce__(self):
        return (_Removed, ())


class _Removed:
    def remove(self) -> None:
        return None


def _call_for(cls: type, original: Callable) -> Callable:
    def __call__(self, *args, **kwargs):
        entry = _hooks.get(id(self)) if type(self) is cls else None  # a subclass's instance: its own wrapper
        if entry is None or entry[0]() is not self:
            return original(self, *args, **kwargs)
        for fn in list(entry[1].values()):
            if type(fn) is weakref.WeakMethod and (fn := fn()) is None:
                continue
            fn(args, kwargs)
        posts = entry[2]
        try:
            return original(self, *args, **kwargs)
        finally:
            for fn in list(posts.values()):
                if type(fn) is weakref.WeakMethod and (fn := fn()) is None:
                    continue
                fn()

    __call__.__ampsafe_call_hooks__ = True
    __call__.__wrapped__ = original
    return __call__


def _acquire(cls: type) -> None:
    count = _users.get(cls, 0)
    if not count:
        _patches.set(cls, "__call__", _call_for(cls, cls.__call__))
    _users[cls] = count + 1


def _release(cls: type) -> None:
    count = _users.get(cls)
    if count is None:
        return
    if count > 1:
        _users[cls] = count - 1
        return
    del _users[cls]
    _patches.undo(cls, "__call__")


def _forget(ident: int, cls: type, lock=_lock, hooks=_hooks) -> None:
    """The weakref callback of a released module. The lock and registry are bound at definition: at interpreter
    exit a module's last reference may go after this module's globals are cleared."""
    with lock:
        if hooks.pop(ident, None) is not None and _release is not None:
            _release(cls)


def _drop(ident: int, key: int, cls: type, lock=_lock, hooks=_hooks) -> None:
    """The weakref callback of a bound-method hook's object: that hook goes (as its handle's ``remove()``)."""
    with lock:
        entry = hooks.get(ident)
        if entry is None or (entry[1].pop(key, None) is None and entry[2].pop(key, None) is None):
            return
        if not entry[1] and not entry[2]:
            del hooks[ident]
            if _release is not None:
                _release(cls)


def _add(module, fn: Callable, slot: int) -> _Handle:
    with _lock:
        key, cls, ident = next(_keys), type(module), id(module)
        entry = _hooks.get(ident)
        if entry is None or entry[0]() is not module:
            ref = weakref.ref(module, lambda _ref, forget=_forget: forget(ident, cls))
            entry = _hooks[ident] = [ref, {}, {}]
            _acquire(cls)
        if isinstance(fn, MethodType):
            try:
                fn = weakref.WeakMethod(fn, lambda _ref, drop=_drop: drop(ident, key, cls))
            except TypeError:  # an object without weak references: held as it is
                pass
        entry[slot][key] = fn
        return _Handle(module, key)


def pre_hook(module, fn: Callable[[tuple, dict], Any]) -> _Handle:
    """Call ``fn(args, kwargs)`` before every ``module(...)`` call (the call's own tuple and dict)."""
    return _add(module, fn, 1)


def post_hook(module, fn: Callable[[], Any]) -> _Handle:
    """Call ``fn()`` after every ``module(...)`` call, also when it raised."""
    return _add(module, fn, 2)


def hooked(module) -> bool:
    """Whether ``module`` itself (not a copy of it) has hooks here."""
    entry = _hooks.get(id(module))
    return entry is not None and entry[0]() is module and bool(entry[1] or entry[2])


# --------------------------------------------------------------------------------------------- top-level calls


class _TopCalls:
    """The modules called at the top level (no other module's forward running on that thread) recently: the
    module a training step really calls with its batch. Kept by weak reference, the latest last."""

    KEEP = 16

    def __init__(self) -> None:
        self.recent: dict[int, weakref.ref] = {}
        self._tls = threading.local()
        self._handles: list = []

    def start(self) -> None:
        if self._handles:
            return
        from torch import is_grad_enabled
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(module, _args):
            depth = getattr(self._tls, "depth", 0)
            if depth == 0 and module.training and is_grad_enabled():
                ident = id(module)
                self.recent.pop(ident, None)
                self.recent[ident] = weakref.ref(module)
                while len(self.recent) > self.KEEP:
                    self.recent.pop(next(iter(self.recent)))
            self._tls.depth = depth + 1

        def post(_module, _args, _output):
            self._tls.depth = max(getattr(self._tls, "depth", 1) - 1, 0)

        self._handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True)]

    def stop(self) -> None:
        """Stop watching calls (what was seen stays): global hooks put every module call on torch's slow path."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def reset(self) -> None:
        """Stop, and forget what was seen (``ampsafe.auto.uninstall``)."""
        self.stop()
        self.recent.clear()

    @property
    def running(self) -> bool:
        return bool(self._handles)

    def modules(self) -> list:
        """The recent top-level modules still alive, the latest first."""
        out = []
        for ref in reversed(list(self.recent.values())):
            module = ref()
            if module is not None:
                out.append(module)
        return out


TOP_CALLS = _TopCalls()
