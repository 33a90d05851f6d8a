"""Counting what a heal costs: the model's forwards and backwards inside each floor or patience check.

A forward pre-hook on the scaler's model (the module its optimizer covers: every replay and scan of the batch
runs it) and a gradient hook on each of its trainable parameters are registered for the duration of each
``_heal_at_floor`` / ``_heal_after_streak`` call (or the ``methods`` asked for) of ``on_floor="heal"``'s handler
(:class:`~ampsafe.healing.floor.HealAtFloor`, for torch and Paddle alike), so the training step's own forward and backward are not counted. Duck-typed over the frameworks on purpose: it counts
through the frameworks' own public hooks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ampsafe.healing.floor import HealAtFloor


@dataclass
class HealCost:
    """One floor or patience check that ran the model: its step, forwards, backwards, and whether it healed."""

    method: str
    forwards: int
    backwards: int
    healed: bool


@dataclass
class HealCosts:
    calls: list[HealCost] = field(default_factory=list)

    @property
    def heals(self) -> list[HealCost]:
        return [c for c in self.calls if c.healed]


def _trainable(param) -> bool:
    return bool(getattr(param, "requires_grad", not getattr(param, "stop_gradient", True)))


def _counted(method: str, original, costs: HealCosts):
    def wrapper(self, scaler, *args, **kwargs):
        model = getattr(scaler, "model", None) or getattr(scaler.heal_hook, "model", None)
        if model is None:
            return original(self, scaler, *args, **kwargs)
        forwards, grads = [0], {}

        def on_forward(_module, _inputs):
            forwards[0] += 1

        def on_grad(key):
            def hook(_grad):
                grads[key] = grads.get(key, 0) + 1

            return hook

        handles = [model.register_forward_pre_hook(on_forward)]
        handles += [p.register_hook(on_grad(i)) for i, p in enumerate(model.parameters()) if _trainable(p)]
        heals = len(scaler.stats.heals)
        try:
            return original(self, scaler, *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            if forwards[0] or grads:
                healed = len(scaler.stats.heals) > heals
                costs.calls.append(HealCost(method, forwards[0], max(grads.values(), default=0), healed))

    return wrapper


CHECKS = ("_heal_at_floor", "_heal_after_streak")


@contextlib.contextmanager
def heal_costs(methods: tuple[str, ...] = CHECKS):
    """Yield a :class:`HealCosts` that fills while the block trains (every ampsafe GradScaler is counted).
    ``methods``: the scaler's checks counted (add ``"_heal_swallowed"`` for the swallowed rule's heal)."""
    costs = HealCosts()
    own = {name: vars(HealAtFloor).get(name) for name in methods}
    for name in own:
        setattr(HealAtFloor, name, _counted(name, getattr(HealAtFloor, name), costs))
    try:
        yield costs
    finally:
        for name, original in own.items():
            if original is None:
                delattr(HealAtFloor, name)  # inherited again
            else:
                setattr(HealAtFloor, name, original)
