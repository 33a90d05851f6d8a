"""``on_floor="heal"``'s handler for a scaler that knows its model: :class:`HealAtFloor`.

:class:`~ampsafe.core.scale.ScalerBase` calls it after every decided step. It feeds the step to its
:class:`~ampsafe.healing.trigger.HealTrigger` (the rules and all their state: the streak, the peak, the swallowed
module, ``patience``) and acts on the rule that is due, in this order::

    floor      a floor hit: the heal hook's plan; a backward-only overflow islands the module whose gradient first
               went non-finite, or moves the floor one backoff down; what stays unhealed is recorded and raised
    records    the run's overflows in a row reach a decay to the floor: healed as at the floor, a failure logged
    patience   ``patience`` overflows in a row: heal when the replayed forward overflows (first when both are due)
    swallowed  a forward overflow the next ops swallowed, on two overflowing steps in a row: heal now

Why a handler object: the heal's state lives in one place (its trigger, pickled with the scaler), and the scaler
keeps no branch of its own for it. Above the floor a heal that cannot heal is logged, not raised: the floor stays
the last resort.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Optional

from ..core.grad_origin import GradOrigin
from ..core.modpath import ancestors
from ..core.scale import LOWEST_SCALE, FloorInfo, HealPlan, HealRecord, HookAtFloor, StepDecision, floor_error
from ..core.swaps import protection_of
from ..core.underflow import LOST_LIMIT, measure_underflow, model_grads
from ..errors import LossScaleFloorError
from .healer import Healer
from .trigger import HealTrigger, swallowed_module

__all__ = ["HealAtFloor"]

log = logging.getLogger("ampsafe.heal")


class HealAtFloor(HookAtFloor):
    """The heal's rules (:mod:`.trigger`) and what each does, for a :class:`~ampsafe.healing.HealingScaler`.
    ``trigger``: the rules' records and ``patience``; ``ranks``: processes in the group, asked at the first
    overflow (the swallowed rule is local)."""

    def __init__(self) -> None:
        self.trigger = HealTrigger()
        self.ranks: Optional[int] = None

    def __getstate__(self) -> dict:
        """The trigger travels without what the process attached (``ampsafe.heal``'s patience) and with patience's
        count restarted; the group's size is asked again."""
        return {"trigger": self.trigger.pickled(), "ranks": None}

    # -- the dispatch ------------------------------------------------------------------------------------------------
    def after_update(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        """The rule of :mod:`ampsafe.healing.trigger` (floor, the run's records, a swallowed forward overflow,
        ``patience``), in that order."""
        trigger = self.trigger
        trigger.observe(decision)
        if decision.floor_hit:
            self._heal_at_floor(scaler, decision, offenders, losses)
            trigger.healed()
        elif decision.found_inf and trigger.records_due(scaler.policy):
            self._heal_from_records(scaler, decision, offenders, losses)
        else:
            swallowed = decision.found_inf and self._swallowed(scaler, decision, losses)
            heals = len(scaler._core.stats.heals)
            self._heal_after_streak(scaler, decision)  # patience first, when both are due
            if len(scaler._core.stats.heals) > heals:
                trigger.healed()
            elif swallowed:
                self._heal_swallowed(scaler, decision)

    def dispatches_floor(self, scaler) -> bool:
        """When the run's records make the next overflow a floor (:mod:`.trigger`)."""
        return self.trigger.records_due(scaler.policy, ahead=1)

    # -- which hook heals ----------------------------------------------------------------------------------------------
    def hook(self, scaler):
        return scaler.heal_hook if scaler.heal_hook is not None else scaler._builtin_heal_hook()

    def scans(self, scaler, hook) -> bool:
        """Whether ``hook`` is a Healer of the resolved model that heals this floor and scans the batch (it
        measures the float32 magnitude then, so the sentinel's replay is the only other run of the batch)."""
        if scaler._resolved is None:
            return False
        return isinstance(hook, Healer) and len(hook.heals) < hook.max_heals and hook._same_batch(scaler)

    def no_hook_reason(self, scaler) -> str:
        return scaler._unresolved_why or "the scaler took no step yet, so it has no model to heal"

    def _backward_healer(self, scaler) -> Optional[Healer]:
        """The Healer that heals this scaler (``ampsafe.heal``'s or the built-in one); None under a hook of the
        script's own, whose decision stands."""
        if scaler.heal_hook is not None:
            return scaler.heal_hook if isinstance(scaler.heal_hook, Healer) else None
        return scaler._builtin_heal_hook()

    # -- floor ---------------------------------------------------------------------------------------------------------
    def _heal_at_floor(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        """The floor's heal; when it heals nothing because the overflow is in the backward (the forward replays
        finite), what the step's gradients measured decides: :meth:`_heal_backward`. What stays unhealed is
        recorded (``stats.refusals``) and raised."""
        try:
            super()._heal_at_floor(scaler, decision, offenders, losses)
        except LossScaleFloorError as exc:
            info = getattr(exc, "info", None)
            try:
                if (
                    info is not None
                    and self._backward_healer(scaler) is not None
                    and self._heal_backward(scaler, decision, info)
                ):
                    return
            except LossScaleFloorError as tried:
                scaler._core.stats.refusals.append((decision.step, str(tried)))
                raise tried from exc
            scaler._core.stats.refusals.append((decision.step, str(exc)))
            raise

    def _heal_backward(self, scaler, decision: StepDecision, info: FloorInfo) -> bool:
        """A backward-only overflow at the floor (the replayed forward is finite, gradients are not): island the
        module whose gradient first went non-finite (an island's backward runs in float32), unless it is an
        island already or no heals are left; else move the floor one backoff down, as the framework's own
        scaler would have backed off. False when neither applies (the caller raises what was measured)."""
        origin: Optional[GradOrigin] = decision.grad_origin
        if info.where != "backward" or origin is None:
            return False
        if self._island_backward(scaler, decision, info, origin):
            return True
        if not decision.floor_hit:
            return False
        reason = (
            f"the gradient of {origin.text} overflows float16 at the floor scale {decision.scale:g} while the forward "
            f"is in range, and {self._why_not_island(scaler, origin)}"
        )
        moved = scaler._core.lower_floor(decision.step, reason, origin.module, lost=lambda s: _lost_at(scaler, s))
        if moved is None:
            raise floor_error(info, scaler._core.policy, heal_failed=_tried(scaler, origin))
        scaler._refresh_scale()
        lost = ""
        if moved.lost is not None:
            lost = f"; {moved.lost:.2%} of the gradient's non-zero elements flush to zero at {moved.scale:g}"
            if moved.lost > LOST_LIMIT:
                lost += f", more than the {LOST_LIMIT:.0%} a scale may lose: the gradient underflows there"
        log.warning(
            "ampsafe: step %s: the scale goes below the floor, %g -> %g: %s (the framework's own scaler would back off "
            "the same way)%s",
            decision.step,
            moved.floor,
            moved.scale,
            reason,
            lost,
        )
        return True

    def _why_not_island(self, scaler, origin: GradOrigin) -> str:
        healer = self._backward_healer(scaler)
        if origin.module == "":
            return "an FP32 island of the whole model is no AMP at all"
        if healer is None:
            return "no heal hook can island it"
        if len(healer.heals) >= healer.max_heals:
            return f"no heals are left (max_heals={healer.max_heals})"
        return f"{origin.module} is an FP32 island already"

    def _island_backward(self, scaler, decision: StepDecision, info: FloorInfo, origin: GradOrigin) -> bool:
        """Island ``origin.module`` when it runs in float16 now and a heal is left; the scale restarts where it is
        (the island is proven by the next steps, and a backward overflow that goes on moves the floor down)."""
        model, healer = scaler._resolved, self._backward_healer(scaler)
        if model is None or healer is None or origin.module == "" or len(healer.heals) >= healer.max_heals:
            return False
        modules = scaler._backend().modules(model)
        if origin.module not in modules or any(
            protection_of(modules[p]) == "island" for p in ancestors(origin.module) if p in modules
        ):
            return False
        result = healer.patch(model, policy="island", level=healer.level, paths=[origin.module])
        islanded = tuple(result.patched) or (origin.module,)
        verdict = replace(info.verdict, module=origin.module) if info.verdict is not None else None
        record = HealRecord(step=decision.step, paths=islanded, found=(origin.module,), verdict=verdict)
        healer.heals.append(record)
        scaler.apply_heal(decision.step, HealPlan(islanded, float(scaler._core.scale), record), info)
        log.warning(
            "ampsafe heal at step %s: islanded %s: its %s overflow float16 at scale %g while the forward is in range "
            "(backward only); an FP32 island's backward runs in float32. Scale stays %g",
            decision.step,
            ", ".join(islanded),
            "parameter gradients" if origin.kind == "parameter" else "input gradient",
            decision.scale,
            float(scaler._core.scale),
        )
        return True

    # -- records -------------------------------------------------------------------------------------------------------
    def _heal_from_records(self, scaler, decision: StepDecision, offenders: list, losses: list) -> None:
        """As many overflows in a row as a decay to the floor takes, and the script put the scale back up in
        between: healed as at the floor. A heal that cannot heal is logged, not raised (the scale is not at
        its floor, and the script's own recovery goes on); the count starts again."""
        trigger, policy = self.trigger, scaler._core.policy
        top = max(policy.init_scale, trigger.peak)
        log.warning(
            "ampsafe: step %s is the %d%s overflowing step in a row, as many as a decay from %g to the floor %g "
            "takes, and the scale is %g (the script restored it in between, e.g. from a checkpoint): healing as "
            "at the floor",
            decision.step,
            trigger.in_row,
            _nth(trigger.in_row),
            top,
            policy.min_scale,
            decision.scale,
        )
        trigger.healed()
        try:
            self._heal_at_floor(scaler, decision, offenders, losses)
        except LossScaleFloorError as exc:
            log.warning("ampsafe: not healed at step %s: %s", decision.step, exc)

    # -- swallowed -----------------------------------------------------------------------------------------------------
    def _swallowed(self, scaler, decision: StepDecision, losses: list) -> bool:
        """Whether this overflowing step, with finite losses, is the second in a row whose forward made a
        module's float16 values non-finite (its output, or an op's result dropped inside it) while the model's
        output stayed finite (one replay under the sentinel, :mod:`.trigger`)."""
        trigger, backend = self.trigger, scaler._backend()
        if self.ranks is None:  # asked once, at the first overflow, which every rank dispatches alike
            self.ranks = len(backend.all_gather(None))
        model = scaler._resolved
        capture = scaler._capture
        latest = capture.latest if capture is not None else None
        if self.ranks > 1 or model is None or latest is None or not losses or not trigger.wants_replay():
            return trigger.saw(None, looked=False)
        if not all(backend.tensors.finite(loss) for loss in losses):
            return trigger.saw(None)
        healer = scaler.heal_hook if isinstance(scaler.heal_hook, Healer) else scaler._healer
        if healer is not None and len(healer.heals) >= healer.max_heals:
            return trigger.saw(None)
        try:
            with capture.paused():
                found = swallowed_module(backend, model, latest, lambda: backend.amp.replay(capture.state))
        except Exception as exc:  # noqa: BLE001 - evidence only: the floor stays the last resort
            log.debug("ampsafe: the replay for a swallowed overflow raised %s: %s", type(exc).__name__, exc)
            found = None
        if found is not None:
            log.info(
                "ampsafe: step %s: %s and the loss stayed finite (the next ops swallowed it)", decision.step, found
            )
        return trigger.saw(found.module if found is not None else None)

    def _heal_swallowed(self, scaler, decision: StepDecision) -> None:
        """A forward overflow no scale fixes, seen twice in a row: heal now, naming this step's module (the
        healer islands it alone when every path its scan finds peaks there, else what its scan finds overflowing
        in the forward, or returns None and the scaler backs off). A heal that cannot heal is logged, not raised:
        the scale is above its floor, which stays the last resort."""
        module = self.trigger.swallowed
        self.trigger.healed()
        log.warning(
            "ampsafe: step %s: a forward overflow in %s swallowed by the next ops on 2 overflowing steps in a row "
            "(finite loss, non-finite gradients): no loss scale fixes it, healing now",
            decision.step,
            module or "<root>",
        )
        try:
            self._off_floor_heal(scaler, decision, swallowed=module)
        except LossScaleFloorError as exc:
            self.trigger.saw(None)  # no replay again before this streak ends
            log.warning("ampsafe: not healed at step %s: %s", decision.step, exc)

    # -- patience ------------------------------------------------------------------------------------------------------
    def _heal_after_streak(self, scaler, decision: StepDecision) -> None:
        """After ``patience`` overflows in a row, heal (when the replayed forward overflows)."""
        if decision.found_inf and self.trigger.patience_due():
            self.trigger.patience_checked(self._off_floor_heal(scaler, decision))

    def _off_floor_heal(self, scaler, decision: StepDecision, swallowed: Optional[str] = None) -> bool:
        """Heal above the floor when the scanned forward overflows (the Healer's ``off_floor``); False when not
        healed (no batch to replay, or the forward is in range). ``swallowed``: the module the heal rule saw
        swallowed (:attr:`FloorInfo.swallowed`)."""
        healer = scaler.heal_hook if isinstance(scaler.heal_hook, Healer) else None
        if healer is None and scaler.heal_hook is None:
            healer = scaler._builtin_heal_hook()
        if healer is None or healer.last_inputs is None:
            log.info("ampsafe heal at step %s: no batch to replay; the scaler backs off", decision.step)
            return False
        info = replace(scaler.floor_info(decision.step), swallowed=swallowed)
        plan = healer(scaler, info, off_floor=True)
        if plan is None:
            return False
        scaler.apply_heal(decision.step, plan, info)
        return True


def _tried(scaler, origin: GradOrigin) -> str:
    """What was tried for a backward overflow that outlived every remedy, for the floor error."""
    stats = scaler._core.stats
    backward = [h for h in stats.heals if h.verdict is not None and h.verdict.where == "backward"]
    islands = [p for h in backward for p in h.paths]
    moved = stats.below_floor
    return (
        f"the gradient of {origin.text} stays non-finite"
        + (f" after islanding {', '.join(islands)}" if islands else "")
        + (f" and after {len(moved)} backoffs below the floor, down to {moved[-1].scale:g}" if moved else "")
        + f" (the lowest scale is {LOWEST_SCALE:g}, float16's smallest subnormal): a gradient non-finite at any "
        "scale is no float16 range problem (a numerical error in the backward, or a non-finite value put into a "
        "gradient). Run the step under ampsafe.watch(model) to name the op."
    )


def _lost_at(scaler, scale: float) -> Optional[float]:
    """The fraction of the step's non-zero parameter-gradient elements (unscaled, as they are at ``update()``)
    that flush to zero in float16 at ``scale`` (:meth:`ampsafe.core.underflow.Underflow.lost_at`); None without a
    model. Measured once per move below the floor."""
    model = scaler._resolved
    if model is None:
        return None
    backend = scaler._backend()
    stats = scaler._core.stats
    return measure_underflow(backend, model_grads(backend, model), 1.0, stats.total_steps).lost_at(scale)


def _nth(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
