"""Where a step's backward first went non-finite: :class:`GradOrigin`, from the step's own gradients.

Why: an overflow that only the backward has (a value head whose bias gradient sums about 200 per token over 512
tokens) leaves the forward finite, so a forward replay, a forward scan or a NaN-detection mode finds nothing.
The step's own backward names it, from two sources, the cheaper first:

    parameters   the parameters whose gradients the step found non-finite (the scalers name them on every
                 overflowing step, while the gradients exist); the one nearest the loss is the origin.
    activations  on a step that follows an overflowing one (:class:`BackwardTrace`, armed), a hook on the floating
                 inputs and outputs of every module records, in the order the backward reaches them, whether
                 each gradient is finite. The module whose output gradients came in finite and one of whose
                 input gradients went out non-finite overflowed in its own backward (an activation gradient).

The trace's hooks exist only from an overflowing step to the next clean one, so a healthy step pays nothing.
Framework-neutral: hooks and tensor facts come from the model's :class:`~ampsafe.core.backend.Backend`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

from .modpath import parent

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
    """Finiteness of every module's input and output gradients in the backward of the steps while armed.

    ``arm()`` hooks every module of ``model`` (a forward pre-hook and a forward hook, which hook the tensors
    each forward reads and makes); ``disarm()`` removes them. ``reset()`` forgets the step's flags;
    ``activation_origin()`` reads them.
    """

    def __init__(self, backend, model) -> None:
        self.backend = backend
        try:  # the scaler that holds this trace must not keep the script's model alive (as its InputCapture)
            self._model = weakref.ref(model)
        except TypeError:  # an object that takes no weak reference: held as it is
            self._model = lambda model=model: model
        self._handles: list = []
        self._order: dict[str, int] = {}
        self._events: list[tuple[int, str, str, bool]] = []  # (tensor key, module, "in"/"out", finite)

    @property
    def model(self):
        """The traced model, or None once it was freed."""
        return self._model()

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        model = self.model
        if self.armed or model is None:
            return
        modules = self.backend.modules(model)
        self._order = {path: i for i, path in enumerate(modules)}
        for path, module in modules.items():
            if path == "":
                continue
            self._handles.append(self.backend.forward_pre_hook(module, self._on_inputs(path)))
            self._handles.append(self.backend.forward_hook(module, self._on_outputs(path)))

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._events = []

    def reset(self) -> None:
        self._events = []

    def _hook(self, tensors, path: str, role: str) -> None:
        facts = self.backend.tensors
        for t in facts.float_leaves(tensors):
            key = id(t)

            def on_grad(grad, key=key) -> None:
                self._events.append((key, path, role, facts.finite(grad)))

            facts.grad_hook(t, on_grad)

    def _on_inputs(self, path: str):
        def record(args: tuple, kwargs: dict) -> None:
            self._hook((args, kwargs), path, "in")

        return record

    def _on_outputs(self, path: str):
        def record(output: Any) -> None:
            self._hook(output, path, "out")

        return record

    def activation_origin(self) -> Optional[str]:
        """The innermost module whose input gradient was the backward's first non-finite gradient while its own
        output gradients were finite; None when no module input was (or nothing was recorded)."""
        bad_out: set[str] = set()
        for i, (key, path, role, finite) in enumerate(self._events):
            if finite:
                continue
            if role == "out":
                bad_out.add(path)
                continue
            same = {p for k, p, r, _ in self._events[i:] if k == key and r == "in"} | {path}
            clean = [p for p in same if p not in bad_out]
            if clean:
                return max(clean, key=lambda p: (p.count(".") + 1, self._order.get(p, -1)))
            return None
        return None


def origin_of(activation: Optional[str], offenders: tuple, order: dict[str, int]) -> Optional[GradOrigin]:
    """The step's :class:`GradOrigin` from the trace's ``activation`` origin and the non-finite parameter names
    (``offenders``, from the loss backwards). Modules later in ``order`` (path -> registration index) run later
    in the forward, so earlier in the backward: the parameter origin wins when its module comes after the
    activation origin (its gradient went non-finite first)."""
    named = tuple(offenders)
    param_module = parent(named[0]) if named else None
    if activation is not None and (param_module is None or _after(activation, param_module, order)):
        return GradOrigin(activation, "activation", named)
    if param_module is not None:
        return GradOrigin(param_module, "parameter", named)
    return None


def _after(a: str, b: str, order: dict[str, int]) -> bool:
    """Whether module ``a`` runs after (or inside) ``b`` in the forward: its backward comes first."""
    if a == b or a.startswith(b + ".") or b == "":
        return True
    return order.get(a, -1) >= order.get(b, -1)


def first_agreed(origins: list) -> Optional[GradOrigin]:
    """One origin for every rank (``origins``: each rank's, in rank order): a parameter origin is the same on
    every rank once gradients are reduced; an activation origin is each rank's own, so the lowest rank's wins."""
    found = [o for o in origins if o is not None]
    return found[0] if found else None
