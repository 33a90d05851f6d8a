"""What makes a bare ampsafe GradScaler heal and explain its floor with no edit to the script.

    scaler = ampsafe.torch.GradScaler("cuda", on_floor="heal")       # no ampsafe.heal call, no model=
    scaler = ampsafe.paddle.GradScaler(on_floor="heal", patience=2)  # heal after 2 overflows in a row

At its first ``step`` / ``minimize`` the scaler resolves its model (``model=`` if given, else the smallest
module whose parameters cover the optimizer's: :meth:`Backend.owner_of`) and keeps the inputs of that model's
latest forward (:class:`~ampsafe.core.capture.InputCapture`, by reference, dropped after every ``update()``).
At the floor it replays that batch once under the sentinel (:func:`ampsafe.healing.floor_replay.measure`) and says
which pass overflowed (a :class:`~ampsafe.core.verdict.HealVerdict`); with ``on_floor="heal"`` it then heals
through a :class:`~ampsafe.healing.Healer` (the one ``ampsafe.heal`` attaches: it completes that verdict with
one scan, islands what overflows, restores the scale; collective under torch.distributed /
paddle.distributed). What heals when is ``on_floor="heal"``'s handler, :class:`~ampsafe.healing.floor.HealAtFloor`,
whose trigger holds ``patience`` (the scaler's, or the one ``ampsafe.heal(..., patience=)`` attaches) with the
heal's other rules. What the step measured reaches :class:`~ampsafe.core.scale.ScalerBase` as one
:class:`ModelEvidence`. Both adapters subclass :class:`HealingScaler`; they name their framework's Backend
(``_backend``), whose ``amp`` part records the precision of each captured forward (``amp.state``), replays the
batch in it (``amp.replay``) and says what the Healer scans (``amp.heal_options``), and they call ``_resolve``.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional

from ..core.amp import OnFloor
from ..core.capture import InputCapture
from ..core.grad_origin import BackwardTrace, first_agreed, origin_of
from ..core.model import unwrap
from ..core.scale import FloorInfo, ScalePolicy, ScalerBase, StepDecision, StepEvidence
from ..core.sentinel import BadInput, nonfinite_input
from ..core.verdict import HealVerdict
from ..errors import ConfigError
from .evidence import repair_running_stats
from .floor import HealAtFloor
from .floor_replay import measure, not_replayed
from .healer import Healer
from .trigger import HealTrigger

__all__ = ["HealingScaler", "ModelEvidence", "check_patience"]

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

    Adapters call ``_init_scaler(policy, callback, model, patience)`` in ``__init__`` and ``_resolve(optimizer)``
    when a step starts, and implement ``_backend()`` (their framework's Backend: its ``amp`` part is the
    precision of the step, its replay and the Healer's level / target).
    """

    FLOOR_HANDLERS: ClassVar[dict] = {**ScalerBase.FLOOR_HANDLERS, OnFloor.HEAL: HealAtFloor}
    disabled_reason: Optional[str] = None
    _resolved_ref: Optional[Callable[[], Any]] = None  # the resolved model, weakly (see ``_resolved``)
    _resolve_done: bool = False
    _unresolved_why: str = ""
    _capture: Optional[InputCapture] = None
    _healer: Optional[Healer] = None
    _trace: Optional[BackwardTrace] = None  # armed from an overflowing step to the next clean one

    def _init_scaler(self, policy: ScalePolicy, callback: Optional[Callable] = None, model=None, patience=None) -> None:
        """:meth:`ScalerBase._init_core`, the heal's ``patience`` and no model resolved yet."""
        self._init_core(policy, callback, model)
        self._heal_trigger().patience = check_patience(patience, policy.on_floor)
        self._resolved_ref, self._resolve_done, self._unresolved_why = None, False, ""
        self._capture = self._healer = None

    def _evidence(self) -> StepEvidence:
        return ModelEvidence(self)

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
        local = origin_of(trace.activation_origin() if trace.armed else None, names, trace.order)
        origin = first_agreed(self._backend().all_gather(local))
        trace.arm()
        if origin is None:
            return decision
        log.debug("ampsafe: step %s overflowed; the gradient first went non-finite in %s", decision.step, origin.text)
        return replace(decision, grad_origin=origin)

    # -- the floor -----------------------------------------------------------------------------------------------
    def _order_offenders(self, offenders: list) -> list:
        """From the loss backwards: the resolved model's parameters in reverse order, the others after them."""
        if self._resolved is None or len(offenders) < 2:
            return list(offenders)
        index = {id(p): i for i, p in enumerate(self._backend().parameters(self._resolved))}
        return sorted(offenders, key=lambda pair: -index.get(id(pair[0]), -1))

    def measure_floor(self, info: FloorInfo, magnitude: bool = True) -> HealVerdict:
        """Replay the last batch once under the sentinel: what overflowed (see :mod:`ampsafe.healing.floor_replay`).
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

    def _builtin_heal_hook(self) -> Optional[Callable]:
        """The Healer of the resolved model, sharing the scaler's capture (built at the first heal)."""
        if self._resolved is None:
            return None
        if self._healer is None:
            options = self._backend().amp.heal_options(self._capture.state)
            self._healer = Healer(self._resolved, backend=self._backend(), capture=self._capture, **options)
        return self._healer

    # -- patience: the heal's trigger holds it -------------------------------------------------------------------------
    def _heal_trigger(self) -> HealTrigger:
        """The trigger of ``on_floor="heal"``'s handler: the heal's rules and their state (``patience`` included)."""
        return self.floor_handler(OnFloor.HEAL).trigger

    @property
    def _patience(self) -> Optional[int]:
        """The scaler's own ``patience=`` (None: off)."""
        return self._heal_trigger().patience

    @property
    def _attached_patience(self) -> Optional[int]:
        """``ampsafe.heal(..., patience=)``'s patience: left behind by pickling, as the hook."""
        return self._heal_trigger().attached

    def attach_patience(self, patience: int) -> None:
        """``ampsafe.heal(model, scaler=self, patience=N)``: heal after N overflowing steps in a row, unless the
        scaler was built with its own ``patience`` (that one counts). Not pickled, like the heal hook."""
        self._heal_trigger().attach(check_patience(patience))

    def _names_every_overflow(self) -> bool:
        """Whether naming the offenders is cheap enough for every overflowing step (a host read per gradient);
        an engine whose gradients are partitioned across ranks says no (reading them back is a collective each)."""
        return True

    # -- pickling ------------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.update(_resolved_ref=None, _resolve_done=False, _capture=None, _healer=None, _trace=None)
        return state


class ModelEvidence(StepEvidence):
    """What a :class:`HealingScaler`'s step measured, as :class:`~ampsafe.core.scale.ScalerBase` asks it: the
    captured inputs, the backward trace and the floor's replay. It reads the scaler's own methods, so a subclass
    refines them (``ampsafe run``'s scaler also checks the inputs its guard saw before the first step)."""

    __slots__ = ("scaler",)

    def __init__(self, scaler: HealingScaler) -> None:
        self.scaler = scaler

    def bad_input(self) -> Optional[BadInput]:
        return self.scaler._bad_input()

    def annotated(self, decision: StepDecision, offenders: list) -> StepDecision:
        return self.scaler._annotated(decision, offenders)

    def skipped_input(self, decision: StepDecision) -> None:
        self.scaler._skipped_input(decision)

    def measured(self, info: FloorInfo, magnitude: bool = True) -> FloorInfo:
        return self.scaler._measured(info, magnitude=magnitude)

    def ordered(self, offenders: list) -> list:
        return self.scaler._order_offenders(offenders)

    def names_every_overflow(self) -> bool:
        """On every overflowing step of a scaler that knows its model (the backward's evidence), when the engine
        can name its gradients cheaply."""
        return self.scaler._resolved is not None and self.scaler._names_every_overflow()

    def end_step(self) -> None:
        self.scaler._end_step()
