"""What makes a bare ampsafe GradScaler heal and explain its floor with no edit to the script.

    scaler = ampsafe.torch.GradScaler("cuda", on_floor="heal")       # no ampsafe.heal call, no model=
    scaler = ampsafe.paddle.GradScaler(on_floor="heal", patience=2)  # heal after 2 overflows in a row

At its first ``step`` / ``minimize`` the scaler resolves its model (``model=`` if given, else the smallest
module whose parameters cover the optimizer's: :meth:`Backend.owner_of`) and keeps the inputs of that model's
latest forward (:class:`~ampsafe.core.capture.InputCapture`, by reference, dropped after every ``update()``).
At the floor it replays that batch once under the sentinel (:func:`ampsafe.healing.verdict.measure`) and says
which pass overflowed (a :class:`~ampsafe.core.verdict.HealVerdict`); with ``on_floor="heal"`` it then heals
through a :class:`~ampsafe.healing.Healer` (the one ``ampsafe.heal`` attaches: it completes that verdict with
one scan, islands what overflows, restores the scale; collective under torch.distributed /
paddle.distributed). ``patience`` (the scaler's, or the one ``ampsafe.heal(..., patience=)`` attaches) is
counted here, once for both, in ``on_floor="heal"``'s handler of :class:`~ampsafe.core.scale.ScalerBase`'s
floor dispatch. Both adapters subclass :class:`HealingScaler`; they name their framework's Backend
(``_backend``), whose ``amp`` part records the precision of each captured forward (``amp.state``), replays the
batch in it (``amp.replay``) and says what the Healer scans (``amp.heal_options``), and they call ``_resolve``.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import replace
from typing import Any, Callable, Optional

from ..core.amp import OnFloor
from ..core.capture import InputCapture
from ..core.grad_origin import BackwardTrace, GradOrigin, first_agreed, origin_of
from ..core.model import unwrap
from ..core.scale import (
    LOWEST_SCALE,
    FloorInfo,
    HealPlan,
    HealRecord,
    ScalePolicy,
    ScalerBase,
    StepDecision,
    floor_error,
)
from ..core.sentinel import BadInput, nonfinite_input
from ..core.swaps import protection_of
from ..core.underflow import LOST_LIMIT, measure_underflow, model_grads
from ..core.verdict import HealVerdict
from ..errors import ConfigError, LossScaleFloorError
from .evidence import repair_running_stats
from .healer import Healer
from .trigger import HealTrigger, swallowed_module
from .verdict import measure, not_replayed

__all__ = ["HealingScaler", "check_patience"]

log = logging.getLogger("ampsafe.heal")


def check_patience(patience, on_floor: OnFloor | str = OnFloor.HEAL) -> Optional[int]:
    """``patience`` validated: an int >= 1 (overflowing steps in a row before a heal) or None; it is counted by
    ``on_floor="heal"``, so it needs that."""
    if patience is None:
        return None
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ConfigError(f"patience must be an int >= 1 (overflowing steps in a row) or None, got {patience!r}")
    on_floor = OnFloor.parse(on_floor)
    if on_floor is not OnFloor.HEAL:
        raise ConfigError(
            f"patience={patience} heals before the floor: it needs on_floor='heal' (got {on_floor.value!r})"
        )
    return patience


class HealingScaler(ScalerBase):
    """Model resolution, input capture, the measured floor verdict, built-in healing and ``patience``.

    Adapters call ``_init_core(policy, callback, model, patience)`` in ``__init__`` and ``_resolve(optimizer)``
    when a step starts, and implement ``_backend()`` (their framework's Backend: its ``amp`` part is the
    precision of the step, its replay and the Healer's level / target).
    """

    disabled_reason: Optional[str] = None
    _patience: Optional[int] = None
    _attached_patience: Optional[int] = None  # ``ampsafe.heal(..., patience=)``: left behind by pickling, as the hook
    _resolved_ref: Optional[Callable[[], Any]] = None  # the resolved model, weakly (see ``_resolved``)
    _resolve_done: bool = False
    _unresolved_why: str = ""
    _capture: Optional[InputCapture] = None
    _healer: Optional[Healer] = None
    _streak: int = 0
    _in_range: bool = False
    _trigger: Optional[HealTrigger] = None  # the run's records the heal rule reads (ampsafe.healing.trigger)
    _ranks: Optional[int] = None  # processes in the group, asked at the first overflow (the swallowed rule is local)
    _trace: Optional[BackwardTrace] = None  # armed from an overflowing step to the next clean one

    def _init_core(self, policy: ScalePolicy, callback: Optional[Callable] = None, model=None, patience=None) -> None:
        super()._init_core(policy, callback, model)
        self._patience = check_patience(patience, policy.on_floor)
        self._attached_patience = None
        self._resolved_ref, self._resolve_done, self._unresolved_why = None, False, ""
        self._capture = self._healer = None
        self._streak, self._in_range = 0, False
        self._trigger = HealTrigger()

    # -- the model and its inputs --------------------------------------------------------------------------------
    @property
    def model(self):
        """The model this scaler replays and heals: ``model=``, or the one resolved at the first step (None
        before it, when no module holds every parameter of the optimizer, or once the script dropped the model)."""
        return self._resolved

    @property
    def _resolved(self):
        """The resolved model, held weakly: the script that trains it holds it; a scaler kept after the script
        dropped its model (``ampsafe run`` keeps every scaler for its summary) does not keep it in memory."""
        return self._resolved_ref() if self._resolved_ref is not None else None

    @property
    def capture(self) -> Optional[InputCapture]:
        """The :class:`InputCapture` of :attr:`model` (None before the first step)."""
        return self._capture

    def _resolve(self, optimizer) -> None:
        """Once, at the first step: the model (``model=`` or ``Backend.owner_of``) and its input capture."""
        if self._resolve_done:
            return
        self._resolve_done = True
        backend = self._backend()
        if self._model is not None:
            model = unwrap(self._model)
        else:
            try:
                model = backend.owner_of(optimizer)
            except Exception as exc:  # noqa: BLE001 - an exotic optimizer: the floor says so, training goes on
                model, self._unresolved_why = None, f"resolving the model failed ({type(exc).__name__}: {exc})"
        if model is None:
            self._unresolved_why = self._unresolved_why or (
                "no live module holds every parameter of the optimizer, so no model was resolved (pass model=)"
            )
            return
        try:
            self._resolved_ref = weakref.ref(model)
        except TypeError:  # an object that takes no weak reference: held as it is
            self._resolved_ref = lambda model=model: model
        self._capture = InputCapture(backend, model, state=backend.amp.state)
        self._trace = BackwardTrace(backend, model)

    def _bad_input(self) -> Optional[BadInput]:
        """The non-finite input of the step's captured forward (checked only on a step that found inf/NaN; under a
        collective forward, FSDP2's, that of any rank: gradients are reduced there, so all ranks found inf)."""
        latest = self._capture.latest if self._capture is not None else None
        bad = nonfinite_input(latest, self._backend().tensors) if latest is not None else None
        model = self._resolved
        if model is None or not self._backend().sharding.forward_is_collective(model):
            return bad
        # every rank decides the step alike (a data step on one rank and a back-off on another would part their
        # scales, and then their floors and heals, whose forwards are collective): another rank's bad input counts
        gathered = self._backend().all_gather(bad)
        return bad if bad is not None else next((b for b in gathered if b is not None), None)

    def _skipped_input(self, decision: StepDecision) -> None:
        """A data step: the running statistics its forward made non-finite restart (the heal's repair), and
        one line says what was skipped and kept."""
        model = self._resolved
        repaired = repair_running_stats(self._backend(), model) if model is not None else []
        log.warning(
            "ampsafe: step %s skipped: a non-finite value came in with the model's input %s, not a float16 "
            "overflow; the loss scale stays %g%s (fix or drop that sample)",
            decision.step,
            decision.bad_input.text,
            decision.scale,
            f"; running statistics reset in {', '.join(repaired[:4])}{', …' if len(repaired) > 4 else ''}"
            if repaired
            else "",
        )

    def _end_step(self) -> None:
        """After ``update()``: the step's inputs are no longer the latest (the capture forgets them)."""
        if self._capture is not None:
            self._capture.drop()
        if self._trace is not None:
            self._trace.reset()

    # -- the backward as evidence ----------------------------------------------------------------------------------
    def _annotated(self, decision: StepDecision, offenders: list) -> StepDecision:
        """An overflowing step names the module whose gradient first went non-finite
        (:mod:`ampsafe.core.grad_origin`), agreed by every rank, and arms the backward trace for the next step; a
        clean step disarms it. Every rank dispatches an overflowing step alike (found_inf is reduced), so the
        all-gather here is met by all of them."""
        trace = self._trace
        if trace is None or trace.model is None:
            return decision
        if not decision.overflow:
            trace.disarm()
            return decision
        own = {id(p): n for n, p in trace.model.named_parameters()} if offenders else {}
        names = tuple(own.get(id(p), label) for p, label in self._order_offenders(offenders))
        order = {path: i for i, path in enumerate(self._backend().modules(trace.model))}
        local = origin_of(trace.activation_origin() if trace.armed else None, names, order)
        origin = first_agreed(self._backend().all_gather(local))
        trace.arm()
        if origin is None:
            return decision
        log.info("ampsafe: step %s overflowed; the gradient first went non-finite in %s", decision.step, origin.text)
        return replace(decision, grad_origin=origin)

    # -- the floor -----------------------------------------------------------------------------------------------
    def _order_offenders(self, offenders: list) -> list:
        """From the loss backwards: the resolved model's parameters in reverse order, the others after them."""
        if self._resolved is None or len(offenders) < 2:
            return list(offenders)
        index = {id(p): i for i, p in enumerate(self._backend().parameters(self._resolved))}
        return sorted(offenders, key=lambda pair: -index.get(id(pair[0]), -1))

    def measure_floor(self, info: FloorInfo, magnitude: bool = True) -> HealVerdict:
        """Replay the last batch once under the sentinel: what overflowed (see :mod:`ampsafe.healing.verdict`).
        ``magnitude=False``: a Healer's scan measures the float32 magnitude instead of a replay of its own."""
        if self._resolved is None:
            return not_replayed(self._unresolved_why or "the scaler took no step yet, so it has no model")
        loss_finite = None if info.scale_independent is None else not info.scale_independent
        amp = self._backend().amp
        try:
            with self._capture.paused():
                return measure(
                    self._backend(),
                    self._resolved,
                    self._capture.latest,
                    replay_context=lambda: amp.replay(self._capture.state),
                    offenders=info.offenders,
                    loss_finite=loss_finite,
                    magnitude=magnitude,
                )
        except Exception as exc:  # noqa: BLE001 - the replay is evidence: its failure is reported, not raised
            return not_replayed(f"the replay of the last batch raised {type(exc).__name__}: {exc}")

    def _measured(self, info: FloorInfo, magnitude: bool = True) -> FloorInfo:
        return replace(info, verdict=self.measure_floor(info, magnitude=magnitude))

    def _scans(self, hook: Optional[Callable]) -> bool:
        """Whether ``hook`` is a Healer of the resolved model that heals this floor and scans the batch (it
        measures the float32 magnitude then, so the sentinel's replay is the only other run of the batch)."""
        if self._resolved is None:
            return False
        return isinstance(hook, Healer) and len(hook.heals) < hook.max_heals and hook._same_batch(self)

    def _builtin_heal_hook(self) -> Optional[Callable]:
        """The Healer of the resolved model, sharing the scaler's capture (built at the first heal)."""
        if self._resolved is None:
            return None
        if self._healer is None:
            options = self._backend().amp.heal_options(self._capture.state)
            self._healer = Healer(self._resolved, backend=self._backend(), capture=self._capture, **options)
        return self._healer

    def _no_heal_reason(self) -> str:
        return self._unresolved_why or "the scaler took no step yet, so it has no model to heal"

    # -- patience: heal a streak of forward overflows before the floor -------------------------------------------------
    def attach_patience(self, patience: int) -> None:
        """``ampsafe.heal(model, scaler=self, patience=N)``: heal after N overflowing steps in a row, unless the
        scaler was built with its own ``patience`` (that one counts). Not pickled, like the heal hook."""
        self._attached_patience = check_patience(patience)

    def _names_offenders(self) -> bool:
        """On every overflowing step of a scaler that knows its model (the backward's evidence,
        :meth:`_annotated`); otherwise at the floor, and when the run's records make this step's overflow a floor
        (:mod:`.trigger`)."""
        if self._core.at_floor or (self._resolved is not None and self._names_every_overflow()):
            return True
        on_heal = self._core.policy.on_floor is OnFloor.HEAL
        return on_heal and self._heal_trigger().records_due(self._core.policy, ahead=1)

    def _names_every_overflow(self) -> bool:
        """Whether naming the offenders is cheap enough for every overflowing step (a host read per gradient);
        an engine whose gradients are partitioned across ranks says no (reading them back is a collective each)."""
        return True

    def _heal_trigger(self) -> HealTrigger:
        if self._trigger is None:  # a scaler unpickled from a version without one
            self._trigger = HealTrigger()
        return self._trigger

    def _heal(self, decision: StepDecision, offenders: list, losses: list) -> None:
        """``on_floor="heal"``'s handler: the rule of :mod:`ampsafe.healing.trigger` (floor, the run's records,
        a swallowed forward overflow, ``patience``), in that order."""
        trigger = self._heal_trigger()
        trigger.observe(decision)
        if decision.floor_hit:
            self._heal_at_floor(decision, offenders, losses)
            self._streak, self._in_range = 0, False  # healed at the floor just now
            trigger.healed()
        elif decision.found_inf and trigger.records_due(self._core.policy):
            self._heal_from_records(decision, offenders, losses)
        else:
            swallowed = decision.found_inf and self._swallowed(decision, losses)
            heals = len(self._core.stats.heals)
            self._heal_after_streak(decision)  # patience first, when both are due
            if len(self._core.stats.heals) > heals:
                trigger.healed()
            elif swallowed:
                self._heal_swallowed(decision)

    def _heal_at_floor(self, decision: StepDecision, offenders: list, losses: list) -> None:
        """The floor's heal; when it heals nothing because the overflow is in the backward (the forward replays
        finite), what the step's gradients measured decides: :meth:`_heal_backward`. What stays unhealed is
        recorded (``stats.refusals``) and raised."""
        try:
            super()._heal_at_floor(decision, offenders, losses)
        except LossScaleFloorError as exc:
            info = getattr(exc, "info", None)
            try:
                if info is not None and self._backward_healer() is not None and self._heal_backward(decision, info):
                    return
            except LossScaleFloorError as tried:
                self._core.stats.refusals.append((decision.step, str(tried)))
                raise tried from exc
            self._core.stats.refusals.append((decision.step, str(exc)))
            raise

    def _heal_backward(self, decision: StepDecision, info: FloorInfo) -> bool:
        """A backward-only overflow at the floor (the replayed forward is finite, gradients are not): island the
        module whose gradient first went non-finite (an island's backward runs in float32), unless it is an
        island already or no heals are left; else move the floor one backoff down, as the framework's own
        scaler would have backed off. False when neither applies (the caller raises what was measured)."""
        origin: Optional[GradOrigin] = decision.grad_origin
        if info.where != "backward" or origin is None:
            return False
        if self._island_backward(decision, info, origin):
            return True
        if not decision.floor_hit:
            return False
        reason = (
            f"the gradient of {origin.text} overflows float16 at the floor scale {decision.scale:g} while the forward "
            f"is in range, and {self._why_not_island(origin)}"
        )
        moved = self._core.lower_floor(decision.step, reason, origin.module, lost=self._lost_at)
        if moved is None:
            raise floor_error(info, self._core.policy, heal_failed=self._tried(origin))
        self._refresh_scale()
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

    def _tried(self, origin: GradOrigin) -> str:
        """What was tried for a backward overflow that outlived every remedy, for the floor error."""
        backward = [h for h in self._core.stats.heals if h.verdict is not None and h.verdict.where == "backward"]
        islands = [p for h in backward for p in h.paths]
        moved = self._core.stats.below_floor
        return (
            f"the gradient of {origin.text} stays non-finite"
            + (f" after islanding {', '.join(islands)}" if islands else "")
            + (f" and after {len(moved)} backoffs below the floor, down to {moved[-1].scale:g}" if moved else "")
            + f" (the lowest scale is {LOWEST_SCALE:g}, float16's smallest subnormal): a gradient non-finite at any "
            "scale is no float16 range problem (a numerical error in the backward, or a non-finite value put into a "
            "gradient). Run the step under ampsafe.watch(model) to name the op."
        )

    def _lost_at(self, scale: float) -> Optional[float]:
        """The fraction of the step's non-zero parameter-gradient elements (unscaled, as they are at ``update()``)
        that flush to zero in float16 at ``scale`` (:meth:`ampsafe.core.underflow.Underflow.lost_at`); None
        without a model. Measured once per move below the floor."""
        model = self._resolved
        if model is None:
            return None
        backend = self._backend()
        return measure_underflow(backend, model_grads(backend, model), 1.0, self._core.stats.total_steps).lost_at(scale)

    def _backward_healer(self) -> Optional[Healer]:
        """The Healer that heals this scaler (``ampsafe.heal``'s or the built-in one); None under a hook of the
        script's own, whose decision stands."""
        if self.heal_hook is not None:
            return self.heal_hook if isinstance(self.heal_hook, Healer) else None
        return self._builtin_heal_hook()

    def _why_not_island(self, origin: GradOrigin) -> str:
        healer = self._backward_healer()
        if origin.module == "":
            return "an FP32 island of the whole model is no AMP at all"
        if healer is None:
            return "no heal hook can island it"
        if len(healer.heals) >= healer.max_heals:
            return f"no heals are left (max_heals={healer.max_heals})"
        return f"{origin.module} is an FP32 island already"

    def _island_backward(self, decision: StepDecision, info: FloorInfo, origin: GradOrigin) -> bool:
        """Island ``origin.module`` when it runs in float16 now and a heal is left; the scale restarts where it is
        (the island is proven by the next steps, and a backward overflow that goes on moves the floor down)."""
        model, healer = self._resolved, self._backward_healer()
        if model is None or healer is None or origin.module == "" or len(healer.heals) >= healer.max_heals:
            return False
        modules = self._backend().modules(model)
        if origin.module not in modules or any(
            protection_of(modules[p]) == "island" for p in _with_parents(origin.module) if p in modules
        ):
            return False
        result = healer.patch(model, policy="island", level=healer.level, paths=[origin.module])
        islanded = tuple(result.patched) or (origin.module,)
        verdict = replace(info.verdict, module=origin.module) if info.verdict is not None else None
        record = HealRecord(step=decision.step, paths=islanded, found=(origin.module,), verdict=verdict)
        healer.heals.append(record)
        self.apply_heal(decision.step, HealPlan(islanded, float(self._core.scale), record), info)
        log.warning(
            "ampsafe heal at step %s: islanded %s: its %s overflow float16 at scale %g while the forward is in range "
            "(backward only); an FP32 island's backward runs in float32. Scale stays %g",
            decision.step,
            ", ".join(islanded),
            "parameter gradients" if origin.kind == "parameter" else "input gradient",
            decision.scale,
            float(self._core.scale),
        )
        return True

    def _heal_from_records(self, decision: StepDecision, offenders: list, losses: list) -> None:
        """As many overflows in a row as a decay to the floor takes, and the script put the scale back up in
        between: healed as at the floor. A heal that cannot heal is logged, not raised (the scale is not at
        its floor, and the script's own recovery goes on); the count starts again."""
        trigger, policy = self._heal_trigger(), self._core.policy
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
        self._streak, self._in_range = 0, False
        try:
            self._heal_at_floor(decision, offenders, losses)
        except LossScaleFloorError as exc:
            log.warning("ampsafe: not healed at step %s: %s", decision.step, exc)

    def _swallowed(self, decision: StepDecision, losses: list) -> bool:
        """Whether this overflowing step, with finite losses, is the second in a row whose forward made a
        module's float16 values non-finite (its output, or an op's result dropped inside it) while the model's
        output stayed finite (one replay under the sentinel, :mod:`.trigger`)."""
        trigger, backend = self._heal_trigger(), self._backend()
        if self._ranks is None:  # asked once, at the first overflow, which every rank dispatches alike
            self._ranks = len(backend.all_gather(None))
        model = self._resolved
        latest = self._capture.latest if self._capture is not None else None
        if self._ranks > 1 or model is None or latest is None or not losses or not trigger.wants_replay():
            return trigger.saw(None, looked=False)
        if not all(backend.tensors.finite(loss) for loss in losses):
            return trigger.saw(None)
        healer = self.heal_hook if isinstance(self.heal_hook, Healer) else self._healer
        if healer is not None and len(healer.heals) >= healer.max_heals:
            return trigger.saw(None)
        try:
            with self._capture.paused():
                found = swallowed_module(backend, model, latest, lambda: backend.amp.replay(self._capture.state))
        except Exception as exc:  # noqa: BLE001 - evidence only: the floor stays the last resort
            log.debug("ampsafe: the replay for a swallowed overflow raised %s: %s", type(exc).__name__, exc)
            found = None
        if found is not None:
            log.info(
                "ampsafe: step %s: %s and the loss stayed finite (the next ops swallowed it)", decision.step, found
            )
        return trigger.saw(found.module if found is not None else None)

    def _heal_swallowed(self, decision: StepDecision) -> None:
        """A forward overflow no scale fixes, seen twice in a row: heal now, naming this step's module (the
        healer islands it alone when every path its scan finds peaks there, else what its scan finds overflowing
        in the forward, or returns None and the scaler backs off). A heal that cannot heal is logged, not raised:
        the scale is above its floor, which stays the last resort."""
        module = self._heal_trigger().swallowed
        self._heal_trigger().healed()
        self._streak, self._in_range = 0, False
        log.warning(
            "ampsafe: step %s: a forward overflow in %s swallowed by the next ops on 2 overflowing steps in a row "
            "(finite loss, non-finite gradients): no loss scale fixes it, healing now",
            decision.step,
            module or "<root>",
        )
        try:
            self._off_floor_heal(decision, swallowed=module)
        except LossScaleFloorError as exc:
            self._heal_trigger().saw(None)  # no replay again before this streak ends
            log.warning("ampsafe: not healed at step %s: %s", decision.step, exc)

    def _heal_after_streak(self, decision: StepDecision) -> None:
        """Count overflows in a row and heal after ``patience`` of them (when the replayed forward overflows)."""
        patience = self._patience if self._patience is not None else self._attached_patience
        if patience is None:
            return
        if not decision.found_inf:
            self._streak, self._in_range = 0, False
            return
        self._streak += 1
        if self._streak < patience or self._in_range:
            return
        self._streak = 0
        if not self._off_floor_heal(decision):
            self._in_range = True

    def _off_floor_heal(self, decision: StepDecision, swallowed: Optional[str] = None) -> bool:
        """Heal above the floor when the scanned forward overflows (the Healer's ``off_floor``); False when not
        healed (no batch to replay, or the forward is in range). ``swallowed``: the module the heal rule saw
        swallowed (:attr:`FloorInfo.swallowed`)."""
        healer = self.heal_hook if isinstance(self.heal_hook, Healer) else None
        if healer is None and self.heal_hook is None:
            healer = self._builtin_heal_hook()
        if healer is None or healer.last_inputs is None:
            log.info("ampsafe heal at step %s: no batch to replay; the scaler backs off", decision.step)
            return False
        info = replace(self.floor_info(decision.step), swallowed=swallowed)
        plan = healer(self, info, off_floor=True)
        if plan is None:
            return False
        self.apply_heal(decision.step, plan, info)
        return True

    # -- pickling ------------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.update(_resolved_ref=None, _resolve_done=False, _capture=None, _healer=None, _streak=0, _in_range=False)
        state.update(_attached_patience=None, _ranks=None, _trace=None)
        return state


def _with_parents(path: str) -> list[str]:
    """``path`` and every module path above it, the root (``""``) last."""
    out = [path]
    while path:
        path = path.rpartition(".")[0]
        out.append(path)
    return out


def _nth(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
