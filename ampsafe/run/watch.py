"""``ampsafe run --watch`` under a scaler: ``ampsafe.watch`` on the trained model, decided at each scaler step.

A dynamic loss scale absorbs a backward overflow: the step is skipped and the scale backs off. So the run stops
only on what the scaler cannot absorb: a non-finite forward value (any scale), a backward overflow at the floor,
a non-finite gradient that unscaling would not make finite (NaN, or an op that ran in float32). Routine backoffs
are counted (``watch_backoffs`` in the summary) and each of the first five named in one line. Nothing on the
scaler instance is replaced: the watcher hears the steps through the run's one step callback
(:meth:`~ampsafe.run.tracked.TrackedScaler.on_step`).
"""

from __future__ import annotations

import logging
import re

from .records import WatchBackoff
from .tracked import disabled_reason

__all__ = ["ScalerWatch", "find_model"]

BACKOFF_LINES = 5  # routine backoffs named each in a line; the rest are counted


class ScalerWatch:
    """The ``--watch`` sentinel of one scaler: from the model's next forward (step 0 when the optimizer came
    first, as scripts build them), else from the scaler's first update. ``session``: the run
    (:class:`~ampsafe.run.session.RunSession`: its banner, its guards, its list of watches)."""

    def __init__(self, session, scaler) -> None:
        self.session = session
        self.scaler = scaler
        self.model_name: str | None = None  # the watched model's class, once started
        self.backoffs: list[WatchBackoff] = []
        self.pending: list = []  # this step's backward events, decided at the scaler's update
        # a disabled scaler's steps are the FP32 guard's, whose --watch replays a skipped one
        self.active = disabled_reason(scaler) is None

    def arm(self) -> None:
        if self.active:
            model = find_model(self.scaler, self.session.guards)
            if model is not None:
                self.start(model)

    def _on_event(self, error) -> None:
        if error.phase == "forward":
            self._raise(error)
        self.pending.append(error)

    def _raise(self, error):
        """Raise the sentinel's ``error``, remembered by the exit hooks: a framework may re-raise it as its own
        type from inside an op (Paddle: ``OSError: (External) NonFiniteError: ...``), and the report names the
        original."""
        self.session.exits.raised.append(error)
        raise error

    def start(self, model) -> None:
        scaler = self.scaler
        try:
            import ampsafe

            _quiet_backward_records()
            ctx = ampsafe.watch(model, on_nonfinite="record", callback=self._on_event)
            # passes are numbered as the scaler numbers its steps (optimizer steps, from 0)
            ctx.step_source = lambda: scaler.stats.total_steps + getattr(scaler, "_lag", 0)
            ctx.__enter__()
        except Exception as exc:  # the sentinel is optional here: training goes on without it
            self.session.say(f"--watch unavailable: {type(exc).__name__}: {exc}")
            return
        self.session.watches.append(ctx)
        self.model_name = type(model).__name__
        self.session.say(
            f"watching {self.model_name} for NaN/Inf (routine loss-scale backoffs are counted, not raised)"
        )

    def on_step(self, decision) -> None:
        if not self.active:
            return
        if self.model_name is None:
            model = find_model(self.scaler, self.session.guards)
            if model is not None:
                self.start(model)
            return
        events, self.pending = self.pending, []
        bad = getattr(decision, "bad_input", None)
        if bad is not None:
            self._raise_input(decision, bad)
        if decision.found_inf:
            self._decide(decision, events[0] if events else None)

    def _raise_input(self, decision, bad) -> None:
        """A step the scaler skipped for its data (a non-finite model input): stop and name the input, as the
        sentinel names one at any precision (kind='input'); never a routine backoff."""
        from ..core.sentinel import INPUT, nonfinite_error

        error = nonfinite_error(
            phase="forward", module="", op="input", kind=INPUT, sample=bad.sample, where=bad.where, step=decision.step
        )
        error.add_note(
            f"ampsafe run --watch: step {decision.step} was skipped with the loss scale kept at {decision.scale:g}: "
            "the non-finite value came in with the model's input"
        )
        self._raise(error)

    def _decide(self, decision, event) -> None:
        """An overflowing step: raise what the scaler cannot absorb, count (and name) a routine backoff."""
        from ..core.sentinel import OVERFLOW

        if event is not None and event.kind != OVERFLOW and not _ran_low(event):
            event.add_note(
                f"ampsafe run --watch: a non-finite gradient no loss scale makes finite (step {decision.step})"
            )
            self._raise(event)
        if decision.floor_hit:
            if event is None:
                return  # the scaler's own floor handling (heal / raise / clamp) speaks for it
            event.add_note(
                f"ampsafe run --watch: step {decision.step} overflowed at the loss-scale floor ({decision.scale:g})"
            )
            self._raise(event)
        where = f"{event.module or '<root>'}:{event.op}" if event is not None else "an unhooked op"
        self.backoffs.append(WatchBackoff(step=decision.step, scale=decision.scale, where=where))
        if len(self.backoffs) <= BACKOFF_LINES:
            self.session.say(
                f"step {decision.step}: backward overflow in {where} at scale {decision.scale:g}: routine, the "
                f"scaler skipped the step and backs off to {decision.next_scale:g}"
                + (" (further backoffs are counted in the summary)" if len(self.backoffs) == BACKOFF_LINES else "")
            )


class _DecidedEvents(logging.Filter):
    """The watcher logs each recorded event; under ``ampsafe run --watch`` each is decided where it happens (a
    forward one raised, a backward one raised at the step or counted as a routine backoff with its own line),
    so its log record would only repeat it."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ..errors import NonFiniteError

        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and isinstance(args[0], NonFiniteError))


def _quiet_backward_records() -> None:
    logger = logging.getLogger("ampsafe.watch")
    if not any(isinstance(f, _DecidedEvents) for f in logger.filters):
        logger.addFilter(_DecidedEvents())


def _ran_low(event) -> bool:
    """Whether a backward event's op ran in float16/bfloat16 (real or emulated), as its message states: a NaN
    born there (inf - inf of an overflowed gradient) goes away at a smaller scale like an overflow does."""
    return re.search(r"\(ran in (float16|bfloat16)", str(event)) is not None


def find_model(scaler, guards: list) -> object | None:
    """The model being trained: the scaler's own, else the owner of an optimizer's parameters (found as the
    scalers find it, ``Backend.owner_of``, by a FP32 guard of ``guards``), else the live root module with the most
    parameters (tensors, then values)."""
    model = getattr(scaler, "model", None) or getattr(scaler, "_model", None)  # resolved, else model=
    if model is not None:
        return model
    for guard in guards:
        models = guard.models()
        if models:
            return models[0]
    from .._framework import imported_backends
    from ..core.backend import live_roots

    def size(bm) -> tuple[int, int]:  # parameter tensors, then values: a tie is not left to gc's object order
        params = bm[0].parameters(bm[1])
        return len(params), sum(bm[0].tensors.numel(p) for p in params)

    roots = [(b, m) for b in imported_backends() for m in live_roots(b)]
    best = max(roots, key=size, default=None)
    return best[1] if best is not None else None
