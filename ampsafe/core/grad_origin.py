"""Where a step's backward first went non-finite: :class:`GradOrigin`, from the step's own gradients.

Why: an overflow that only the backward has (a value head whose bias gradient sums about 200 per token over 512
tokens) leaves the forward finite, so a forward replay, a forward scan or a NaN-detection mode finds nothing.
The step's own backward names it, from two sources, the cheaper first:

    parameters   the parameters whose gradients the step found non-finite (the scalers name them on every
                 overflowing step, while the gradients exist); the one nearest the loss is the origin.
    activations  on a step that follows an overflowing one (:class:`BackwardTrace`, armed), a hook on the floating
                 inputs of every module records, in the order the backward reaches them, whether each gradient
                 is finite. The first non-finite one was made by the backward of the module that read that input
                 (its output gradients, which are the inputs of the modules after it, came earlier and finite):
                 that module overflowed in its own backward (an activation gradient).

The trace's hooks exist only from an overflowing step to the next clean one, so a healthy step pays nothing. They
are forward pre-hooks, which torch keeps outside the module (:mod:`ampsafe.torch.callhooks`): a trainer that
pickles its model while the trace is armed (ultralytics saves a checkpoint each epoch) pickles no hook.
Framework-neutral: hooks and tensor facts come from the model's :class:`~ampsafe.core.backend.Backend`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

from .modpath import parent, under

__all__ = ["GradOrigin", "BackwardTrace", "origin_of", "first_agreed"]


@dataclass(frozen=True)
class GradOrigin:
    """The module whose gradient first went non-finite: ``kind`` ``"parameter"`` (its own parameters'
    gradients) or ``"activation"`` (the gradient it passed back to its inputs); ``params``: the non-finite
    parameter names of the step, from the loss backwards."""

    module: str
    kind: str
    params: tuple = ()

    @property
    def text(self) -> str:
        what = "parameter gradients" if self.kind == "parameter" else "input gradient (an activation gradient)"
        return f"{self.module or '<root>'} ({what})"


class BackwardTrace:
    """Finiteness of every module's input gradients in the backward of the steps while armed.

    ``arm()`` hooks every module of ``model`` (a forward pre-hook, which hooks the tensors each forward reads);
    ``disarm()`` removes them. ``reset()`` forgets the step's flags; ``activation_origin()`` reads them.
    """

    def __init__(self, backend, model) -> None:
        self.backend = backend
        try:  # the scaler that holds this trace must not keep the script's model alive (as its InputCapture)
            self._model = weakref.ref(model)
        except TypeError:  # an object that takes no weak reference: held as it is
            self._model = lambda model=model: model
        self._handles: list = []
        self._order: dict[str, int] = {}
        self._events: list[tuple[int, str, bool]] = []  # (tensor key, module that read it, finite), in order

    @property
    def model(self):
        """The traced model, or None once it was freed."""
        return self._model()

    @property
    def order(self) -> dict[str, int]:
        """Module path -> its registration index (a later module runs later in the forward), read once."""
        if not self._order:
            model = self.model
            self._order = {p: i for i, p in enumerate(self.backend.modules(model))} if model is not None else {}
        return self._order

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        model = self.model
        if self.armed or model is None:
            return
        modules = self.backend.modules(model)
        for path, module in modules.items():
            if path == "":
                continue
            self._handles.append(self.backend.forward_pre_hook(module, self._on_inputs(path)))

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._events = []

    def reset(self) -> None:
        self._events = []

    def _on_inputs(self, path: str):
        facts = self.backend.tensors

        def record(args: tuple, kwargs: dict) -> None:
            for t in facts.float_leaves((args, kwargs)):
                facts.grad_hook(t, self._on_grad(id(t), path))

        return record

    def _on_grad(self, key: int, path: str):
        def on_grad(grad) -> None:
            self._events.append((key, path, self.backend.tensors.finite(grad)))

        return on_grad

    def activation_origin(self) -> Optional[str]:
        """The innermost module that read the input whose gradient was the backward's first non-finite one; None
        when every input gradient was finite (or nothing was recorded)."""
        first = next((i for i, (_, _, finite) in enumerate(self._events) if not finite), None)
        if first is None:
            return None
        key = self._events[first][0]
        readers = {path for k, path, _ in self._events[first:] if k == key}
        return max(readers, key=lambda p: (p.count(".") + 1, self.order.get(p, -1)))


def origin_of(activation: Optional[str], offenders: tuple, order: dict[str, int]) -> Optional[GradOrigin]:
    """The step's :class:`GradOrigin` from the trace's ``activation`` origin and the non-finite parameter names
    (``offenders``, from the loss backwards). Modules later in ``order`` (path -> registration index) run later
    in the forward, so earlier in the backward: the parameter origin wins when its module comes after the
    activation origin (its gradient went non-finite first)."""
    named = tuple(offenders)
    param_module = parent(named[0]) if named else None
    if activation is not None and (param_module is None or _runs_after(activation, param_module, order)):
        return GradOrigin(activation, "activation", named)
    if param_module is not None:
        return GradOrigin(param_module, "parameter", named)
    return None


def _runs_after(a: str, b: str, order: dict[str, int]) -> bool:
    """Whether module ``a`` runs after (or inside) ``b`` in the forward: its backward comes first."""
    return under(a, b) or order.get(a, -1) >= order.get(b, -1)


def first_agreed(origins: list) -> Optional[GradOrigin]:
    """One origin for every rank (``origins``: each rank's, in rank order): a parameter origin is the same on
    every rank once gradients are reduced; an activation origin is each rank's own, so the lowest rank's wins."""
    found = [o for o in origins if o is not None]
    return found[0] if found else None
