"""What happens when an overflow meets the floor: one handler per :class:`OnFloor` value, and the floor's words.

A *floor hit* is an overflowing step taken while the scale already sits at ``min_scale``: no smaller scale is
allowed, so backing off can't cure it. :class:`ScalerBase` calls the handler of ``decision.on_floor`` once per
decided step (not for a step skipped for its data)::

    RaiseAtFloor  (raise)  a floor hit raises LossScaleFloorError naming the offenders and the measured pass
    ClampAtFloor  (clamp)  nothing: the scale stays at the floor and the overflowing steps are skipped
    HookAtFloor   (heal)   a floor hit calls ``scaler.heal_hook`` and restarts from its scale, or raises what was
                           measured; a scaler that knows its model uses
                           :class:`ampsafe.healing.floor.HealAtFloor`, whose trigger also heals before the floor

Why objects: each value's behaviour and state (the heal's records, its patience) sit in one class, and a new value
is one new handler, not a branch in the scaler. The handlers keep no reference to their scaler (it is passed in),
so a pickled scaler carries its handlers' state and nothing of the training loop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from ...errors import LossScaleFloorError
from ..live_objects import live_objects
from .state import FloorInfo, StepDecision

__all__ = [
    "floor_message",
    "floor_error",
    "names_from_live_modules",
    "FloorHandler",
    "RaiseAtFloor",
    "ClampAtFloor",
    "HookAtFloor",
]


def floor_message(info: FloorInfo, min_scale: float, hysteresis: int, heal_failed: Optional[str] = None) -> str:
    """The sentence a :class:`LossScaleFloorError` carries: where (as measured), how the scale fell, what to do.

    ``info.verdict`` is what the replay of the last batch measured (a :class:`HealVerdict`); without one
    the pass is said to be unknown, never inferred from the loss. ``heal_failed``: why a heal did not heal
    (``""``: no reason known); None when no heal was tried, and then the advice fits the measured pass.
    """
    named = (
        ", ".join(f"{name} (module {mod!r})" for name, mod in zip(info.offenders[:8], info.modules[:8]))
        or "none on this process (they were on another rank, or in no gradient the optimizers hold)"
    )
    if len(info.offenders) > 8:
        named += f" and {len(info.offenders) - 8} more"
    history = ", ".join(f"{s:g}" for s in info.scale_history[-12:])
    if info.verdict is not None:
        where = f"Replayed under ampsafe.watch, the last batch overflows in {info.verdict.text}."
        if info.where == "not replayed":
            where = f"The last batch was {info.verdict.text}."
    else:
        where = "Which pass overflowed was not measured (no replay of the last batch)."
    return (
        f"loss scale reached its floor min_scale={min_scale:g} at step {info.step} and gradients still overflow "
        f"(hysteresis={hysteresis}). Non-finite gradients: {named}. Recent scales: [{history}]. {where} "
        + _advice(info.where, heal_failed)
    )


def _advice(where: Optional[str], heal_failed: Optional[str]) -> str:
    """What to do, fitted to the measured pass and to what was tried."""
    if heal_failed is not None:
        return (
            f"on_floor='heal' could not heal it: {heal_failed}" if heal_failed else "on_floor='heal' could not heal it."
        )
    fix = {
        "forward": "No loss scale fixes a forward overflow: keep that path in float32 (ampsafe.patch(model, "
        "inputs, paths=[...]) or policy='island'), or on_floor='heal' to island it and go on.",
        "loss": "Compute the loss in float32 (outside autocast), or guard the op that overflows in it.",
        "data": "Fix or drop that sample (ampsafe.check_targets / ampsafe.core.targets.checked); no loss scale "
        "or FP32 island fixes bad data.",
        "backward": "A smaller scale is not allowed: lower min_scale, keep the named layers in float32 "
        "(ampsafe.scan(model, inputs, loss_fn=...) finds the gradient paths), or on_floor='clamp' to keep "
        "skipping such steps.",
    }.get(where or "")
    return fix or "Use on_floor='clamp' to keep skipping such steps, or on_floor='heal' to island the offending paths."


def floor_error(info: FloorInfo, policy, prefix: str = "", heal_failed: Optional[str] = None) -> LossScaleFloorError:
    """The :class:`LossScaleFloorError` for a floor hit (``.modules`` and ``.info`` let ``ampsafe.heal`` act)."""
    err = LossScaleFloorError(
        prefix + floor_message(info, policy.min_scale, policy.hysteresis, heal_failed),
        offenders=info.offenders,
        scale_history=info.scale_history,
        scale_independent=info.scale_independent,
    )
    err.modules = list(info.modules)
    err.info = info
    return err


def names_from_live_modules(module_type: type, wrappers=frozenset()) -> dict[int, str]:
    """id(parameter) -> the longest name any live ``module_type`` (not a wrapper class named in ``wrappers``)
    gives it, i.e. the root model's name. Walks the garbage collector: only for the rare floor path."""
    names: dict[int, str] = {}
    for obj in live_objects(module_type):
        if type(obj).__name__ not in wrappers:
            try:
                items = obj.named_parameters()
            except Exception:  # a half-built module: nothing to name
                continue
            for name, p in items:
                if len(name) > len(names.get(id(p), "")):
                    names[id(p)] = name
    return names


class FloorHandler:
    """One :class:`OnFloor` value's action after an update (:meth:`after_update`), and whether it treats an
    overflow of the step now ending as a floor (:meth:`dispatches_floor`: the adapters then name the non-finite
    parameters while their gradients still exist)."""

    def after_update(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        raise NotImplementedError  # pragma: no cover - every OnFloor value has its handler

    def dispatches_floor(self, scaler) -> bool:
        return False


class RaiseAtFloor(FloorHandler):
    """``on_floor="raise"``: a floor hit raises what was measured."""

    def after_update(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        if decision.floor_hit:
            info = scaler.floor_info(decision.step, offenders, losses)
            raise floor_error(scaler._evidence().measured(info), scaler.policy)


class ClampAtFloor(FloorHandler):
    """``on_floor="clamp"``: nothing to do; the state machine keeps the scale at the floor and the step was
    skipped."""

    def after_update(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        return None


class HookAtFloor(FloorHandler):
    """``on_floor="heal"`` for a scaler that knows no model: at a floor hit, measure, ask ``scaler.heal_hook`` and
    restart from its scale; raise what was measured when it can't. :class:`ampsafe.healing.floor.HealAtFloor` refines
    which hook heals (:meth:`hook`), whether it scans the batch itself (:meth:`scans`) and why none heals
    (:meth:`no_hook_reason`)."""

    def after_update(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        if decision.floor_hit:
            self._heal_at_floor(scaler, decision, offenders, losses)

    def hook(self, scaler) -> Optional[Callable]:
        return scaler.heal_hook

    def scans(self, scaler, hook: Optional[Callable]) -> bool:
        """Whether ``hook`` scans the batch itself (then the floor's replay leaves the magnitude to it)."""
        return False

    def no_hook_reason(self, scaler) -> str:
        return "no heal hook is set (ampsafe.heal(model, scaler=scaler) sets one)"

    def _heal_at_floor(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        """Measure the floor, ask the heal hook, restart from its scale; raise what was measured when it can't."""
        hook = self.hook(scaler)
        info = scaler.floor_info(decision.step, offenders, losses)
        info = scaler._evidence().measured(info, magnitude=not self.scans(scaler, hook))
        policy = scaler.policy
        if hook is None:
            raise floor_error(info, policy, heal_failed=self.no_hook_reason(scaler))
        try:
            plan = hook(scaler, info)
        except LossScaleFloorError as exc:
            why = str(exc).removeprefix("not healed: ")
            verdict = getattr(exc, "verdict", None)  # the hook's own findings added to the measured verdict
            if verdict is not None:
                info = replace(info, verdict=verdict)
            raise floor_error(info, policy, heal_failed=why) from exc
        scaler.apply_heal(decision.step, plan, info)
