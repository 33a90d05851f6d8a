"""The one interface between ampsafe's framework-neutral logic and a framework: :class:`Backend`.

Why: scan, patch, watch, heal and ``ampsafe run`` all need the same few framework facts (module paths, what
model state a forward may move, how to run in float32, how to hook a forward). Each framework answers them
once, in its adapter package (``ampsafe.torch.backend.TorchBackend``, ``ampsafe.paddle.backend.PaddleBackend``);
``ampsafe._framework.backend_of(model)`` picks the instance, and nothing else asks which framework it is.
Pure Python: importing it imports neither torch nor paddle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Protocol

from .graph import Graph

__all__ = ["Backend", "AdapterModules", "owner_of", "live_roots"]


class Backend(Protocol):
    """What ampsafe needs to know about one framework. One instance per framework, stateless."""

    name: str  # "torch" | "paddle", as reports spell it
    tensor_type: type
    module_type: type

    # -- structure
    def modules(self, model) -> dict[str, Any]:
        """Module path -> module, the root as ``""``, as ``named_modules()`` / ``named_sublayers()`` spell it."""

    def children(self, module) -> list: ...

    def parameters(self, module) -> list: ...

    def optimizer_params(self, optimizer) -> list:
        """Every parameter the optimizer updates, across its groups."""

    def live_modules(self) -> list:
        """Every module of this framework alive in the process (``gc``): where to look when no model is known."""

    def owner_of(self, optimizer, candidates: Iterable | None = None):
        """The smallest module whose parameters cover ``optimizer``'s (see :func:`owner_of`), or None."""

    # -- state a forward may move
    def state_tensors(self, model) -> list:
        """Buffers plus the normalization statistics the framework keeps elsewhere: the one rule of what a
        forward may change besides activations (Paddle's BatchNorm ``_mean``/``_variance`` are non-trainable
        parameters)."""

    def snapshot(self, model) -> Callable[[], None]:
        """Copy :meth:`state_tensors` now; the returned function puts them (and their slots) back."""

    def norm_stats(self, module) -> tuple[Any, Any] | None:
        """(mean, variance) of a normalization's running statistics, or None: the one rule of what they are."""

    def running_stats(self, model) -> Iterator[tuple[str, Any, Any, Any]]:
        """(path, module, mean, variance) of every normalization layer that keeps running statistics."""

    def reset_running_stats(self, mean, var) -> None:
        """Back to their initial values: mean 0, variance 1."""

    # -- numerics
    def float32(self) -> ContextManager:
        """No autocast, no float16 emulation, no grad: what float32 really gives."""

    def tensors(self, obj) -> list:
        """The tensors in a nested output (tensors, lists, tuples, namedtuples, dicts)."""

    def all_finite(self, t) -> bool: ...

    def to_numpy(self, t):
        """float32 host copy of a floating tensor; None for anything else."""

    def abs_max(self, t):
        """max |t| as a 0-d device tensor (no host sync)."""

    def all_gather(self, obj) -> list:
        """``obj`` of every rank in rank order; ``[obj]`` outside a process group."""

    # -- hooks
    def forward_pre_hook(self, model, fn: Callable[[tuple, dict], None]):
        """Call ``fn(args, kwargs)`` before every forward of ``model``; returns a handle with ``remove()``."""

    def trace(self, model, example_inputs, *, level, target, loss_fn=None, loss_scale=None) -> Graph:
        """One recorded forward (and backward with ``loss_fn``) as a framework-neutral graph, state restored."""

    def trace_hooks(self, model, *, level: str, target: str):
        """The tracer's hooks for one trace of ``model``: a :class:`~ampsafe.core.record.TraceHooks` (the
        framework's op interception and tensor mechanics; the recording algorithm is core's)."""

    def watch(self, model, **options):
        """The framework's ``ampsafe.watch`` context object."""

    @property
    def patcher(self):
        """The policies' adapter (``ctx.adapter``: ``modules``, ``save_buffers``, ``is_conv``, ...)."""


class AdapterModules:
    """The Backend methods written once for every framework: walking nested outputs, and handing over to the
    rest of the adapter package. Subclasses live in ``ampsafe.<name>.backend`` and name their package's
    ``trace``, ``watch`` and ``patch`` modules in ``_package()`` (plain imports, on first use, so resolving a
    backend stays cheap)."""

    def _package(self) -> tuple:
        """(trace, watch, patch): the adapter package's modules."""
        raise NotImplementedError

    def trace(self, model, example_inputs, **options) -> Graph:
        return self._package()[0].trace(model, example_inputs, **options)

    def trace_hooks(self, model, *, level: str, target: str):
        return self._package()[0].trace_hooks(model, level=level, target=target)

    def watch(self, model, **options):
        return self._package()[1].Watch(model, **options)

    @property
    def patcher(self):
        return self._package()[2].ADAPTER

    def tensors(self, obj) -> list:
        """The tensors in a nested output: lists, tuples (namedtuples included) and dict values, in order."""
        if isinstance(obj, self.tensor_type):
            return [obj]
        if isinstance(obj, dict):
            return [t for v in obj.values() for t in self.tensors(v)]
        if isinstance(obj, (list, tuple)):
            return [t for v in obj for t in self.tensors(v)]
        return []


def owner_of(backend: Backend, optimizer, candidates: Iterable | None = None):
    """The smallest module whose parameters include every parameter of ``optimizer``; None if none does.

    ``candidates``: root models to search (their submodules count); without them every live module of the
    framework is searched (``gc``). From the covering root with the fewest parameters it descends while a
    child still covers them all, so a wrapper (DDP, a ``Sequential`` holding the model and a loss) gives way
    to the model it wraps, and an optimizer over a head alone resolves to the head.
    """
    wanted = {id(p) for p in backend.optimizer_params(optimizer)}
    if not wanted:
        return None
    roots = list(candidates) if candidates is not None else live_roots(backend)

    def covers(module) -> bool:
        return wanted <= {id(p) for p in backend.parameters(module)}

    covering = [m for m in roots if covers(m)]
    if not covering:
        return None
    best = min(covering, key=lambda m: len(backend.parameters(m)))
    while True:
        child = next((c for c in backend.children(best) if covers(c)), None)
        if child is None:
            return best
        best = child


def live_roots(backend: Backend) -> list:
    """The live modules of the backend's framework that are no other live module's child."""
    modules = backend.live_modules()
    inner = {id(c) for m in modules for c in backend.children(m)}
    return [m for m in modules if id(m) not in inner]
