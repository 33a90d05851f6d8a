"""One ``ampsafe run`` installation as one object: :class:`RunSession`.

Why: the run keeps state from install to exit: its options, every patch it made (the ledger), the scalers it
built, its FP32 guards, its ``--watch`` sentinels, the banner's changes and how the script ended. A session owns
all of it, with every field declared up front; installing is entering it and uninstalling is leaving it (as
``torch.utils.module_tracker`` registers global hooks in ``__enter__`` and removes them in ``__exit__``):

    with RunSession(RunOptions(on_floor="raise")) as session:
        train()
    session.summary()           # a RunSummary (ampsafe.run.records)

One module global holds the session installed last (:func:`current`); its summary stays readable after
``uninstall``. What a framework needs patched is its own backend's to do: right after a registered framework's
import finishes (a post-import hook, :mod:`ampsafe.run.finder`), its ``Backend.install_run(options, ledger,
site)`` runs, with :class:`~ampsafe.run.site.RunSite` as the site.
"""

from __future__ import annotations

import os
import sys
import threading

from ..core.ledger import AttrPatches
from .exits import ExitHooks, explain_exit, keep_at_exit_first
from .finder import AfterImport
from .options import RunOptions
from .records import GuardRecord, RunSummary, TargetRecord
from .site import RunSite
from .tracked import TrackedScaler, disabled_reason
from .watch import ScalerWatch, find_model

__all__ = ["RunSession", "current", "summary", "LOCK"]

LOCK = threading.RLock()  # installing, uninstalling and tracking a scaler
_current: RunSession | None = None


def current() -> RunSession | None:
    """The session installed last (still open, or left), or None before any."""
    return _current


def summary() -> RunSummary:
    """The summary of the session installed last; before any, one with only this process's target checks."""
    if _current is not None:
        return _current.summary()
    return RunSummary(pid=os.getpid(), targets=_targets())


def _targets() -> tuple[TargetRecord, ...]:
    from .target_hooks import stats

    return tuple(TargetRecord.from_dict(t) for t in stats())


def _track(scaler, framework: str, kwargs: dict) -> None:
    """A run scaler class built a scaler: the session installed last tracks it (a class may outlive its session)."""
    if _current is not None:
        _current.track(scaler, framework, kwargs)


def _reloaded(scaler, before: float | None) -> None:
    if _current is not None:
        _current.reloaded(scaler, before)


class RunSession:
    """One installation of ``ampsafe run`` with ``options``. ``scalers``: the scalers of an earlier session the
    summary keeps listing (a reinstall with other options keeps them)."""

    def __init__(self, options: RunOptions, scalers: list[TrackedScaler] | None = None) -> None:
        self.options = options
        self.ledger = AttrPatches("ampsafe run")  # every patch of the run (torch, Paddle, trainers)
        self.finder = AfterImport()
        self.site = RunSite(self, built=_track, reloaded=_reloaded)
        self.scalers: list[TrackedScaler] = scalers if scalers is not None else []
        self.guards: list = []  # StepGuard per framework (ampsafe.run.guard)
        self.watches: list = []  # --watch contexts entered under a scaler
        self.changes: list[str] = []  # the summary's list of what the run changed
        self.exits = ExitHooks(explain=lambda: explain_exit(self.guards))
        self.open = False

    # -- enter / exit
    def __enter__(self) -> RunSession:
        global _current
        with LOCK:
            _current, self.open = self, True
            self.exits.install(self.ledger)
            from .._framework import REGISTRY

            for name in REGISTRY:  # a framework's name is its top-level module
                self.finder.when_imported(name, lambda _module, _name=name: self._install_framework(_name))
            from .. import hosts

            hosts.install(self)  # each trainer's part when its module is imported (ampsafe.hosts)
        return self

    def _install_framework(self, name: str) -> None:
        """The registered framework ``name`` has just been imported: its backend puts the run's hooks in place."""
        from .._framework import backend_named

        backend_named(name).install_run(self.options, self.ledger, self.site)
        keep_at_exit_first()  # the framework registered its exit cleanups while it was imported

    def __exit__(self, *exc_info) -> None:
        """Undo everything the run put in place (every patch and hook in its ledger, the emulators it installed)
        and drop pending hooks (registered necks stay registered)."""
        with LOCK:
            self.ledger.restore()
            self.finder.clear()
            for ctx in self.watches:
                ctx.__exit__(None, None, None)
            self.watches.clear()
            for guard in self.guards:
                guard.enabled = False  # an optimizer method wrapped by another guard passes straight through
            self.open = False

    # -- what the run's pieces call
    def say(self, message: str) -> None:
        """A banner line (stderr), unless ``quiet``."""
        if not self.options.quiet:
            print(f"[ampsafe] {message}", file=sys.stderr, flush=True)

    def set_attr(self, owner, attr: str, value) -> None:
        """Patch one attribute where it exists, recorded in the ledger (the caller reports the change)."""
        if hasattr(owner, attr):
            self.ledger.set(owner, attr, value)

    def track(self, scaler, framework: str, kwargs: dict) -> TrackedScaler:
        """A scaler the run built: its one step callback registered, the headroom sampler and ``--watch`` armed
        on it."""
        tracked = TrackedScaler(scaler, framework, kwargs)
        with LOCK:
            self.scalers.append(tracked)
        if hasattr(scaler, "add_step_callback"):
            scaler.add_step_callback(tracked.on_step)
            if self.open and self.options.headroom_every and disabled_reason(scaler) is None:
                from .headroom import HeadroomSampler

                every, model = self.options.headroom_every, find_model(scaler, self.guards)
                tracked.headroom = HeadroomSampler(
                    scaler, every, prefix=lambda: tracked.holder_path, model=model, underflow=self.options.underflow
                )
        if self.open:
            self._static_scale(tracked, scaler, framework, kwargs)
        if self.open and self.options.watch:
            tracked.watch = ScalerWatch(self, scaler)
            tracked.watch.arm()
        if self.open and self.options.tensorboard:
            from .board import tensorboard

            tensorboard(self, tracked)
        return tracked

    def _static_scale(self, tracked: TrackedScaler, scaler, framework: str, kwargs: dict) -> None:
        """A scaler built with a fixed scale of 1: named now, measured on its steps (ampsafe.run.static_scale)."""
        from .static_scale import StaticScaleWatch, static_scale_of

        scale = static_scale_of(scaler)
        if scale is not None:
            tracked.static = StaticScaleWatch(scaler, framework, kwargs, scale, self.say)

    def reloaded(self, scaler, before: float | None) -> None:
        """The scaler's state was loaded from a checkpoint: an event of the run (the report lists it)."""
        tracked = next((t for t in self.scalers if t.scaler is scaler), None)
        if tracked is None:
            return
        event = tracked.reloaded(before)
        self.say(
            f"the script loaded its GradScaler's state (a checkpoint reload) after step {event.after_step}: scale "
            f"{before} -> {event.scale_after}; the run's counters and heal records are kept"
        )

    def summary(self) -> RunSummary:
        """What the run changed, and per scaler created: its class, framework, the script's own arguments and
        stats; the FP32 guards, the target checks and how the script ended."""
        return RunSummary(
            pid=os.getpid(),
            options=self.options if self.open else None,
            changes=tuple(self.changes),
            scalers=tuple(t.record() for t in self.scalers),
            guards=tuple(GuardRecord.from_dict(g.to_dict()) for g in self.guards),
            targets=_targets(),
            ended=self.exits.ended,
        )
