"""The step's end and the floor dispatch both GradScaler adapters share around :class:`LossScaleState`.

Why a base class with three hooks: the adapters only move tensors (``_backend``, ``_refresh_scale``) and a scaler
that knows its model adds what the step measured (``_evidence``); every decision lives in the state machine
(:mod:`.state`) and every floor action in a handler object (:mod:`.floor`), so nothing here branches on
``on_floor`` or on what a subclass knows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional

from ..amp import OnFloor
from ..modpath import parent
from ..sentinel import BadInput
from .floor import ClampAtFloor, FloorHandler, HookAtFloor, RaiseAtFloor, floor_error, names_from_live_modules
from .policy import ScalePolicy
from .state import FloorInfo, HealPlan, HealRecord, LossScaleState, ScalerStats, StepDecision

__all__ = ["ScalerBase", "StepEvidence"]


class StepEvidence:
    """What a step measured beyond found_inf, as :class:`ScalerBase` asks it; this one measures nothing (a scaler
    that knows no model). :class:`ampsafe.healing.scaler.HealingScaler`'s evidence reads its model's captured
    inputs, backward trace and a replay of the batch."""

    def bad_input(self) -> Optional[BadInput]:
        """The non-finite input of this step's forward (None: finite, or no forward was seen)."""
        return None

    def annotated(self, decision: StepDecision, offenders: list) -> StepDecision:
        """``decision`` with what the step's backward measured (a scaler that knows its model names the module
        whose gradient first went non-finite)."""
        return decision

    def skipped_input(self, decision: StepDecision) -> None:
        """A step skipped for its data has been decided."""

    def measured(self, info: FloorInfo, magnitude: bool = True) -> FloorInfo:
        """``info`` with the measured verdict of the floor (here: none, nothing to replay)."""
        return info

    def ordered(self, offenders: list) -> list:
        """(parameter, label) pairs in the order the floor's error names them."""
        return list(offenders)

    def names_every_overflow(self) -> bool:
        """Whether the adapters name the non-finite parameters on every overflowing step, not only at the floor."""
        return False

    def end_step(self) -> None:
        """After ``update()``, whatever happened: the step's inputs are no longer the latest."""


NO_EVIDENCE = StepEvidence()


class ScalerBase:
    """The step's end, the floor dispatch and the policy accessors both GradScaler adapters share around
    :class:`LossScaleState`: the adapters only move tensors.

    A step ends in one place, :meth:`_end_update` (``update()``; Paddle's ``minimize`` and fixed-scale ``step``)::

        gather       the adapter: found_inf (its one host sync), the offenders when :meth:`_names_offenders`, the
                     losses ``scale()`` saw; None when there is nothing to decide (``update(new_scale)``, a step
                     decided on the device, nothing stepped)
        data         found_inf with a non-finite model input (``evidence.bad_input()``, checked only on such steps):
                     LossScaleState.skip_input, no dispatch (data is never an overflow: :mod:`.state`)
        decide       LossScaleState.update(found_inf) -> StepDecision (``evidence.annotated``); the adapter's scale
                     tensor follows
        dispatch     the handler of decision.on_floor (:mod:`.floor`), the one place on_floor acts:
                       raise  RaiseAtFloor: a floor hit raises LossScaleFloorError (offenders, measured pass)
                       clamp  ClampAtFloor: nothing; the scale stays at the floor, overflowing steps are skipped
                       heal   FLOOR_HANDLERS[OnFloor.HEAL]: at a floor hit the heal hook's plan, or the error;
                              ampsafe.healing.floor.HealAtFloor's trigger also heals before the floor
        observe      every ``add_step_callback(fn)``: fn(decision), in the order added, after the dispatch (a
                     heal has restored the scale), also when the dispatch raised (a step the floor stopped is
                     still a step the loggers see); an observer that raises ends the step with its own error
        end          ``evidence.end_step()``: the step's inputs are no longer the latest (also when anything raised)

    Hooks (the only methods a subclass overrides): ``_backend()`` (the framework's Backend), ``_refresh_scale()``
    (copy ``_core.scale`` into the adapter's scale tensor) and ``_evidence()`` (what the step measured: a
    :class:`StepEvidence`). Adapters call :meth:`_init_core` (the policy, ``callback=``, ``model=``) and may set
    ``_wrappers`` (module classes that only wrap a model, skipped when parameters are named from the live modules)
    and ``_core.pending`` (steps decided elsewhere, folded in before the statistics are read).
    """

    # one handler class per OnFloor value, built once per scaler (a handler may keep state: the heal's trigger)
    FLOOR_HANDLERS: ClassVar[dict[OnFloor, type]] = {
        OnFloor.RAISE: RaiseAtFloor,
        OnFloor.CLAMP: ClampAtFloor,
        OnFloor.HEAL: HookAtFloor,
    }
    _core: LossScaleState
    _model: Any = None
    _wrappers: ClassVar[frozenset] = frozenset()
    _handlers: Optional[dict] = None
    heal_hook: Optional[Callable] = None

    def _init_core(self, policy: ScalePolicy, callback: Optional[Callable] = None, model=None) -> None:
        """The state machine of ``policy``, the ``callback=`` observer and ``model=`` (names parameters)."""
        self._core = LossScaleState(policy)
        if callback is not None:
            self.add_step_callback(callback)
        self._model = model
        self._handlers = {}
        self.heal_hook = None
        self.metric_sources: list = []  # what else amp_metrics reads (each ``.metrics()``): the run's sampler

    @property
    def policy(self) -> ScalePolicy:
        return self._core.policy

    @property
    def stats(self) -> ScalerStats:
        """total/skipped/overflow steps, floor hits, the recent scales and the heals."""
        if self._core.pending is not None:
            self._core.pending()
        return self._core.stats

    def add_step_callback(self, fn: Callable[[StepDecision], Any]) -> None:
        """Call ``fn(decision)`` after every update, once the floor is dispatched (loggers: VisualDL, TensorBoard;
        ``ampsafe run``'s report and ``--watch``)."""
        self._core.callbacks.append(fn)

    def _set_policy(self, **changes) -> None:
        self._core.policy = replace(self._core.policy, **changes)

    def floor_handler(self, on_floor: OnFloor) -> FloorHandler:
        """The handler of ``on_floor`` (built at its first use, then kept: its state lives as long as the scaler)."""
        if self._handlers is None:
            self._handlers = {}
        handler = self._handlers.get(on_floor)
        if handler is None:
            handler = self._handlers[on_floor] = self.FLOOR_HANDLERS[on_floor]()
        return handler

    # -- one step's end -------------------------------------------------------------------------------------------
    def _end_update(self, gather: Callable[[], Optional[tuple]]) -> Optional[StepDecision]:
        """Gather the step (``gather()``: ``(found_inf, offenders, losses)`` or None), decide it, dispatch the
        floor and tell the observers, in the order of the class docstring."""
        try:
            step = gather()
            return None if step is None else self._decide(*step)
        finally:
            self._evidence().end_step()

    def _decide(self, found_inf: bool, offenders: list, losses: list) -> StepDecision:
        evidence = self._evidence()
        bad_input = evidence.bad_input() if found_inf else None
        before = self._core.scale
        decision = self._core.update(found_inf) if bad_input is None else self._core.skip_input(bad_input)
        if self._core.scale != before:
            self._refresh_scale()
        if bad_input is None:
            decision = evidence.annotated(decision, offenders)
        try:
            if bad_input is None:
                self.floor_handler(decision.on_floor).after_update(self, decision, offenders, losses)
            else:
                evidence.skipped_input(decision)
        finally:
            for observe in list(self._core.callbacks):
                observe(decision)
        return decision

    def _names_offenders(self) -> bool:
        """Whether an overflow of the step now ending is measured per parameter (the adapters then name the
        parameters whose gradients are non-finite, while those still exist): at the floor, on every overflow when
        the evidence asks (the backward's), or when the floor's handler dispatches this overflow as a floor."""
        if self._core.at_floor or self._evidence().names_every_overflow():
            return True
        return self.floor_handler(self._core.policy.on_floor).dispatches_floor(self)

    # -- the floor's facts ----------------------------------------------------------------------------------------
    def floor_info(self, step: int, offenders: list = (), losses: list = ()) -> FloorInfo:
        """What a heal hook is told: ``offenders`` are (parameter, fallback label) pairs whose gradients were
        non-finite, ``losses`` the losses ``scale()`` saw this step (to tell a non-finite loss apart)."""
        names = self._param_names() if offenders else {}
        labelled = [names.get(id(p), label) for p, label in self._evidence().ordered(offenders)]
        independent = None
        if losses:
            finite = self._backend().tensors.finite
            independent = not all(finite(loss) for loss in losses)
        return FloorInfo(
            step=step,
            offenders=tuple(labelled),
            modules=tuple(parent(name) for name in labelled),
            scale_before_collapse=self._core.last_clean_scale,
            scale_history=tuple(self._core.stats.scale_history),
            scale_independent=independent,
        )

    def apply_heal(self, step: int, plan, info: Optional[FloorInfo] = None) -> HealRecord:
        """Record what a heal hook did (a :class:`HealPlan`, or just the healed module paths) and restart from
        its scale (default: the scale of the last clean step). Also for hooks that heal off the floor."""
        if not isinstance(plan, HealPlan):
            plan = HealPlan(tuple(plan or ()))
        if not plan.paths:
            raise floor_error(
                info or self.floor_info(step), self._core.policy, "The heal hook healed nothing. ", heal_failed=""
            )
        record = self._core.heal(step, plan)
        self._refresh_scale()
        return record

    def _param_names(self) -> dict[int, str]:
        """id(parameter) -> qualified name, from ``model`` or else every live module (rare path only)."""
        if self._model is not None:
            return {id(p): n for n, p in self._model.named_parameters()}
        return names_from_live_modules(self._backend().module_type, self._wrappers)

    # -- pickling: the state travels, the hooks stay ----------------------------------------------------------------
    MID_ITERATION = (
        "A GradScaler instance may only be pickled at the beginning of an iteration, or at the end after "
        "scaler.update()."
    )

    def __getstate__(self) -> dict:
        """What ``pickle`` (also ``copy.deepcopy``, ``torch.save(scaler)``) carries: the policy, the scale, the
        trackers and the statistics, never the training loop around them. Left behind (they would drag the model
        into the pickle, or can't be pickled at all): ``model=``, the step callbacks, ``heal_hook`` (and the
        patience ``ampsafe.heal(..., patience=)`` attached) and methods wrapped on the instance (``ampsafe run
        --watch``). After loading the
        scaler works; it names parameters from the live modules as without ``model=``. Re-attach what you
        need: ``add_step_callback(fn)``, ``ampsafe.heal(model, scaler=scaler)``."""
        state = {
            name: value
            for name, value in self.__dict__.items()
            if not callable(getattr(type(self), name, None))  # an instance-level wrapper of a method
        }
        state["_model"] = None
        state["heal_hook"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _backend(self):  # pragma: no cover - adapters
        raise NotImplementedError

    def _refresh_scale(self) -> None:  # pragma: no cover - adapters
        raise NotImplementedError

    def _evidence(self) -> StepEvidence:
        """What this step measured beyond found_inf (here: nothing; a scaler that knows its model measures)."""
        return NO_EVIDENCE
