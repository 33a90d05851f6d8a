"""When a healing scaler (``on_floor="heal"``) heals: one rule, read from the run's own records.

    floor      the step overflowed with the scale at ``min_scale`` (a floor hit): always the last resort
    records    the run's overflowing steps in a row reach what a monotone decay from the highest scale it used needs
               to hit the floor (halvings to ``min_scale`` x ``hysteresis`` + 1): the script restored the scale in
               between (ultralytics reloads ``last.pt`` after a NaN epoch, a resume loop), so the floor never comes
    swallowed  on two consecutive overflowing steps (clean steps between them do not count: one page of an
               epoch can be the one that overflows) the forward made a module's float16 values non-finite while
               the model's output and the loss stayed finite: its output (a frozen BatchNorm and a ReLU turn a
               conv's float16 inf into zeros; only a gradient shows it), or, inside its forward, an op's result
               that is finite in float32 (DBHead's ``reciprocal(1 + exp(x))``: the inf dies in the head). No loss
               scale fixes a forward overflow, in the same module on both steps or not (PaddleOCR at O1: the
               thresh head's conv, then the binarize head's, whose paths the heal's scan islands together)
    patience   ``patience`` overflowing steps in a row (the scaler's, or the one ``ampsafe.heal`` attaches)

What each rule does when due: :class:`~ampsafe.healing.floor.HealAtFloor`.

Why these and no more: without a reload, "records" is due at the very step the floor is hit (the count starts
from the highest scale the run used), so a run that decays monotonically heals exactly where it did before;
"swallowed" needs a finite loss *and* a finite model output with a module output non-finite, or an op whose
float16 result the forward dropped while its float32 result is finite (:func:`swallowed_module`): a range problem,
never a numerical one (``log(0)`` in T5's position bucketing is -inf in float32 too). A forward overflow that
reaches the output gives neither, so it keeps healing at the floor. One taken by a train-mode BatchNorm (Paddle's
BatchNorm returns finite values from the inf; PaddleOCR's DBFPN and head at O1) or dropped inside one module (the
step function at O2) heals on its second step, and the heal's statistics repair resets the running statistics the
inf poisoned. ``patience`` acts first when both are due.

The records survive a checkpoint reload: they live on the scaler, never in its ``state_dict``. The "swallowed"
evidence is one extra forward under the sentinel (``watch(on_nonfinite="record", backward=False)``: each op's
output checked, an origin's op re-run in float32), replayed in the step's precision with no grad (model state and
random state put back), at the first overflowing step of a streak that has a batch to replay, and then only while
it keeps finding one; single-process runs only (under a process group each rank's batch differs and the replay is
not collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple, Optional

from ..core.model import first_nonfinite
from ..core.sentinel import OVERFLOW
from .floor_replay import _quiet

__all__ = ["HealTrigger", "Swallowed", "floor_distance", "swallowed_module"]


def floor_distance(policy, peak: float) -> Optional[int]:
    """Overflowing steps in a row at which a monotone decay from ``max(policy.init_scale, peak)`` hits the floor
    (the halvings times ``hysteresis``, plus the floor hit itself); None when the scale has no floor."""
    if not policy.dynamic or not policy.min_scale > 0:
        return None
    top = max(float(policy.init_scale), float(peak))
    ratio = top / float(policy.min_scale)
    halvings = 0 if ratio <= 1 else math.ceil(math.log(ratio) / -math.log(policy.backoff_factor) - 1e-9)
    return halvings * int(policy.hysteresis) + 1


@dataclass
class HealTrigger:
    """The records the rules read, and all their state: ``in_row`` overflowing steps in a row (the one count of
    the streak: the records rule and patience read it), ``peak`` the highest scale a step ran with, ``swallowed``
    the module of the previous overflowing step's swallowed overflow, clean steps between them or not (None: none
    seen; ``""`` never: the rule names submodules).

    Patience: ``patience`` (the scaler's own, which wins) or ``attached`` (``ampsafe.heal(..., patience=)``, left
    behind by pickling, as the heal hook). It counts the streak from ``since`` (the count at its last check: a
    floor hit, a heal that found the forward in range, an attach or a pickle restart it); after a check whose
    forward was in range (``in_range``) it waits for a clean step."""

    in_row: int = 0
    peak: float = 0.0
    swallowed: Optional[str] = None
    looked: bool = False  # a step of this streak was replayed for a swallowed overflow
    patience: Optional[int] = None
    attached: Optional[int] = None
    since: int = 0
    in_range: bool = False

    def observe(self, decision) -> None:
        """One dispatched step (an overflow or a clean one; a data step never comes here)."""
        self.peak = max(self.peak, float(decision.scale))
        if decision.found_inf:
            self.in_row += 1
            self.since += decision.floor_hit  # a floor hit is the floor's to heal, not a step patience counts
        else:  # the streak ends; the module the last overflowing step showed is kept for the next one
            self.in_row, self.looked = 0, False
            self.since, self.in_range = 0, False

    def records_due(self, policy, ahead: int = 0) -> bool:
        """Whether the run's overflows in a row (plus ``ahead`` more) reach the floor's distance."""
        need = floor_distance(policy, self.peak)
        return need is not None and self.in_row + ahead >= need

    def wants_replay(self) -> bool:
        """Whether this overflowing step is looked at for a swallowed overflow: the first of a streak that has a
        batch to replay, or one after a step that showed one."""
        return not self.looked or self.swallowed is not None

    def saw(self, module: Optional[str], looked: bool = True) -> bool:
        """Record this overflowing step's swallowed module (None: none; ``looked``: whether it was replayed);
        True when the previous overflowing step showed one too."""
        again = module is not None and self.swallowed is not None
        self.swallowed, self.looked = module, self.looked or looked
        return again

    @property
    def counted_patience(self) -> Optional[int]:
        """The patience that counts: the scaler's own, else the attached one (None: patience is off)."""
        return self.patience if self.patience is not None else self.attached

    def attach(self, patience: int) -> None:
        """``ampsafe.heal(..., patience=)``'s patience; a patience that was off starts counting now."""
        if self.counted_patience is None:
            self.since = self.in_row
        self.attached = patience

    def patience_due(self) -> bool:
        """Whether ``patience`` overflows in a row are reached since the last check, and the last check's forward
        was not in range."""
        patience = self.counted_patience
        return patience is not None and not self.in_range and self.in_row - self.since >= patience

    def patience_checked(self, healed: bool) -> None:
        """Patience's check ran: its count restarts; a forward in range (not ``healed``) waits for a clean step."""
        self.since = self.in_row
        self.in_range = self.in_range or not healed

    def healed(self) -> None:
        self.in_row, self.swallowed, self.looked = 0, None, False
        self.since, self.in_range = 0, False

    def pickled(self) -> HealTrigger:
        """The trigger a pickled scaler carries: the records, without the attached patience, patience's count
        restarted."""
        return replace(self, attached=None, since=self.in_row, in_range=False)


class Swallowed(NamedTuple):
    """What one replay found: ``module``, and ``op`` when the non-finite value died inside that module's forward
    (the op whose float16 result was non-finite and its float32 result finite); None when the module's output was
    non-finite itself."""

    module: str
    op: Optional[str] = None

    def __str__(self) -> str:
        where = self.module or "<root>"
        if self.op is None:
            return f"the float16 output of {where} is non-finite"
        return f"{where}:{self.op} is non-finite in float16 (finite in float32) and dropped inside {where}"


def swallowed_module(backend, model, latest, replay_context: Callable[[], Any]) -> Optional[Swallowed]:
    """Replay ``latest`` (``InputCapture.latest``) once in the step's precision under the sentinel, when the
    model's output is finite: the first module whose output is non-finite, else the first range overflow the
    sentinel saw the forward drop inside a submodule (its module and op); None otherwise. Model state and random
    state are put back."""
    args, kwargs = latest
    watches: list = []

    def forward():
        with _quiet("ampsafe.watch"), replay_context():
            with backend.watch(model, on_nonfinite="record", backward=False) as watch:
                watches.append(watch)
                return model(*args, **kwargs)

    first, output_finite = first_nonfinite(backend, model, forward)
    if not output_finite:
        return None
    if first is not None:
        return Swallowed(first)
    # a submodule's: an island of the root is no AMP at all (the healer refuses it)
    deferred = getattr(watches[0], "deferred", ()) if watches else ()
    dropped = next((e for e in deferred if e.kind == OVERFLOW and e.module), None)
    return Swallowed(dropped.module, dropped.op) if dropped is not None else None
