"""Keep the inputs of a model's latest forward, so the last batch can be replayed: :class:`InputCapture`.

Why: a scaler at its floor (or ``ampsafe run``'s FP32 guard) has to replay the batch that overflowed, to
measure where it overflowed and to heal it, in a script nobody edited. The capture is one forward pre-hook
that keeps a reference to the arguments (no copies: the tensors are the caller's, alive until the step ends
anyway) and forgets them on :meth:`InputCapture.drop`, which the scalers call after each ``update()``.
Framework-neutral: the hook comes from the :class:`~ampsafe.core.backend.Backend`.

    capture = InputCapture(backend, model)
    loss = loss_fn(model(images), labels)   # capture.latest == ((images,), {})
    ...
    capture.drop()                          # after the optimizer step: capture.latest is None
    capture.remove()                        # detach the hook

``state``: an optional ``fn() -> object`` called at each captured forward; read it as ``.state``. The scalers
pass ``backend.amp.state`` (:class:`~ampsafe.core.backend.Amp`: the framework's autocast / float16-emulation
state), so ``backend.amp.replay(capture.state)`` runs the forward as the step did.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .model import unwrap

__all__ = ["InputCapture", "example_inputs"]


def example_inputs(model, latest: tuple[tuple, dict]):
    """The ``example_inputs`` (a tuple of arguments, or a dict of keyword arguments) that call ``model`` as a
    captured forward ``(args, kwargs)`` was called: the args, the kwargs (HF's ``model(**batch)``), or both as one
    dict named by the forward's signature. The one rule for every replay that scans or heals a captured batch;
    ValueError when the inputs cannot be named (a forward that takes ``*args`` beside keywords)."""
    args, kwargs = latest
    if not kwargs:
        return tuple(args)
    if not args:
        return dict(kwargs)
    try:
        signature = inspect.signature(unwrap(model).forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"positional and keyword inputs that the forward's signature cannot name: {exc}") from None
    named: dict = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            raise ValueError("positional inputs the forward takes as *args have no name for scan's dict")
        named.update(value if kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    return named


class InputCapture:
    """The ``(args, kwargs)`` of ``model``'s latest forward, by reference.

    ``latest`` is None before the first forward and after :meth:`drop`; each forward replaces it. The
    tuple and dict are the ones the framework passed to the hook (the tensors are never copied). Paddle's
    pre-hooks see no keyword arguments, so there ``kwargs`` is always ``{}``.

    ``model`` is held weakly: the capture watches a model its owner (a scaler, a healer) and the training script
    hold; it does not keep alive a model they dropped (a sweep builds many). It is None once the model is freed.
    """

    def __init__(self, backend, model, state: Callable[[], Any] | None = None) -> None:
        self.backend = backend
        try:
            self._model = weakref.ref(model)
        except TypeError:  # an object that takes no weak reference: held as it is
            self._model = lambda model=model: model
        self._state_fn = state
        self._latest: tuple[tuple, dict] | None = None
        self._state: Any = None
        self._paused = 0
        self._handle = backend.forward_pre_hook(model, self._record)

    @property
    def model(self):
        """The captured model, or None once it was freed."""
        return self._model()

    def _record(self, args: tuple, kwargs: dict) -> None:
        if self._paused:
            return
        self._latest = (args if isinstance(args, tuple) else tuple(args), kwargs if kwargs else {})
        if self._state_fn is not None:
            self._state = self._state_fn()

    @property
    def latest(self) -> tuple[tuple, dict[str, Any]] | None:
        """``(args, kwargs)`` of the latest forward since the last :meth:`drop`, or None."""
        return self._latest

    @property
    def state(self) -> Any:
        """What ``state()`` returned at the latest forward (None without ``state`` or after :meth:`drop`)."""
        return self._state

    @contextmanager
    def paused(self) -> Iterator[InputCapture]:
        """Replays of the captured batch (the floor's verdict, a heal's scan) leave ``latest`` and ``state`` as
        the step recorded them: a float32 replay would otherwise record float32 as the step's precision."""
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    def drop(self) -> None:
        """Forget the captured inputs (the scalers call this after each ``update()``)."""
        self._latest = self._state = None

    def remove(self) -> None:
        """Detach the hook and forget the inputs; ``latest`` stays None from now on."""
        self._latest = self._state = None
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def attached(self) -> bool:
        return self._handle is not None

    def __repr__(self) -> str:
        state = "empty" if self._latest is None else f"{len(self._latest[0])} args, {len(self._latest[1])} kwargs"
        return f"InputCapture({type(self.model).__name__}, {state}{'' if self.attached else ', removed'})"
