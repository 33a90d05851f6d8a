"""The run's framework-neutral pieces, as a framework's ``Backend.install_run(options, ledger, site)`` gets them.

Why here: they live in the run (its banner, its list of changes, its scaler class, its FP32 guards, its target
checks), and a backend package is below ``ampsafe.run`` and never imports it. :class:`RunSite` implements the
:class:`~ampsafe.core.backend.Site` protocol for one :class:`~ampsafe.run.session.RunSession`.
"""

from __future__ import annotations

from typing import Callable

from .scaler_class import shim, with_floor

__all__ = ["RunSite"]


class RunSite:
    """What a framework's ``install_run`` gets besides the options and the ledger, for ``session``. ``built`` /
    ``reloaded``: what the scaler classes call for each scaler built and each checkpoint reload (the session's
    module functions, so that a class outliving its session reports to the current one)."""

    def __init__(self, session, *, built: Callable, reloaded: Callable) -> None:
        self.session = session
        self._built, self._reloaded = built, reloaded

    def say(self, line: str) -> None:
        """A line for the banner (stderr) only."""
        self.session.say(line)

    def note(self, line: str) -> None:
        """A line for the summary's list of changes only (one per patched attribute)."""
        self.session.changes.append(line)

    def tell(self, line: str) -> None:
        """A line for both."""
        self.note(line)
        self.say(line)

    def swap(self, ledger, owner, attr: str, value, label: str) -> None:
        """``owner.attr = value`` (recorded in ``ledger``) where ``owner`` has that attribute, ``label`` noted in
        the summary: a framework version without one of the spellings keeps going."""
        if owner is not None and hasattr(owner, attr):
            ledger.set(owner, attr, value)
            self.note(label)

    def when_imported(self, name: str, callback: Callable) -> None:
        """``callback(module)`` right after module ``name`` is imported (now if it is)."""
        self.session.finder.when_imported(name, callback)

    def scaler_class(self, base: type, backend, **how) -> type:
        """The class the run puts in place of ``backend``'s GradScaler: see
        :func:`~ampsafe.run.scaler_class.with_floor`, with the run's floor under the argument names of
        ``backend.amp.scaler_args``; each scaler it builds is tracked by the current session."""
        defaults = self.session.options.scaler_kwargs(backend.amp.scaler_args)
        return with_floor(base, backend.name, defaults, built=self._built, reloaded=self._reloaded, **how)

    def track(self, scaler, framework: str) -> None:
        """A scale the run put in place without building a scaler class (a DeepSpeed engine's): tracked as one."""
        self._built(scaler, framework, {})

    def through_scaler(self):
        """Context for a step whose inner optimizer steps a loss scale already checks (a DeepSpeed engine's
        optimizer): the FP32 guard lets them through, as inside a scaler's ``step``."""
        from .guard import through_scaler

        return through_scaler(True)

    def shim(self, cls: type, replaces: type | None) -> type:
        """Another spelling built on :meth:`scaler_class`'s class (``torch.cuda.amp``'s, Paddle's ``AmpScaler``):
        its type claims ``ampsafe.auto``, ``isinstance`` answers for ``replaces``."""
        return shim(cls, replaces)

    def step_guard(self, backend, offenders: Callable):
        """The FP32 guard of ``backend``'s optimizers (:class:`~ampsafe.run.guard.StepGuard`), with the run's
        options; it records the optimizer classes it wraps in the run's ledger. A step goes ahead when the loss
        and every gradient the optimizer updates are finite (``backend.tensors.grads_finite``, one host sync)."""
        from .guard import StepGuard

        options = self.session.options
        guard = StepGuard(
            backend,
            offenders,
            max_skips=options.max_skips,
            watch=options.watch,
            say=self.session.say,
            patches=self.session.ledger,
            underflow_every=options.headroom_every if options.underflow else 0,
        )
        self.session.guards.append(guard)
        return guard

    def target_hook(self, where: str, policy: str):
        """A :class:`~ampsafe.run.target_hooks.TargetHook`: checks the boxes of one entry point, counted in the summary."""
        from .target_hooks import TargetHook

        return TargetHook(where, policy)
