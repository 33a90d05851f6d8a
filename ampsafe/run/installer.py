"""The zero-edit installer behind ``import ampsafe.auto`` (a notebook) and ``ampsafe run``'s child process.

* ``torch.amp.GradScaler`` (also ``torch.amp.grad_scaler.GradScaler``, ``torch.cuda.amp.GradScaler``,
  ``torch.cpu.amp.GradScaler``) and ``paddle.amp.GradScaler`` resolve to ampsafe's scalers, called with the
  script's own arguments plus ampsafe's floor (``min_scale`` / ``min_loss_scaling`` and ``on_floor``);
* the AMP-safe necks are registered in PaddleOCR / PaddleDetection, so swapped configs build;
* every optimizer step no enabled ampsafe scaler guards is guarded (:mod:`ampsafe.run.guard`: a non-finite loss
  or gradient skips the step), and detection targets are checked before the model sees them
  (:mod:`ampsafe.run.target_hooks`: torchvision's ``GeneralizedRCNN``, ppdet's target-building batch transforms);
* with ``emulate_fp16``, ``ampsafe.torch.cuda_emulation`` / ``ampsafe.paddle.amp_emulation`` are installed.

This module is the wiring: each installation is a :class:`~ampsafe.run.session.RunSession` (its options, ledger,
scalers, guards, watches, changes and ending), entered by :func:`install` and left by :func:`uninstall`.
``summary()`` reports every scaler created. Options come from ``install(...)`` or, on import, from the
``AMPSAFE_RUN_OPTIONS`` environment variable (JSON; set by ``ampsafe run``).
"""

from __future__ import annotations

from .exits import at_exit, mark_loaded, write_report, write_report_on_sigterm
from .launcher import format_summary
from .options import ENV_OPTIONS, ENV_REPORT, RunOptions
from .session import LOCK, RunSession, current
from .session import summary as _summary

__all__ = ["install", "uninstall", "summary", "format_summary", "installed", "ENV_OPTIONS", "ENV_REPORT"]


def install(
    *,
    on_floor: str = "heal",
    min_scale: float = 1.0,
    watch: bool = False,
    quiet: bool = False,
    max_skips: int = 10,
    on_bad_target: str = "raise",
    report: str | None = None,
    emulate_fp16: bool = False,
    metrics: bool = True,
    tensorboard: str | None = None,
    headroom_every: int = 10,
    underflow: bool = True,
) -> RunOptions:
    """Put ampsafe in place and return the options in force (a :class:`~ampsafe.run.options.RunOptions`).

    A second call with the same options changes nothing; a call with other options (``import ampsafe.auto``
    has already installed the defaults) undoes the first installation and installs again with them, so the
    options in force are always the last ones asked for. Scalers built before keep the floor they were built with.

    The options of ``ampsafe run`` (``on_floor`` heal|raise|clamp, ``min_scale``, ``watch``, ``max_skips``,
    ``on_bad_target`` raise|drop, ``emulate_fp16``, ``metrics``, ``tensorboard``, ``headroom_every``, ``underflow``); ``report``
    is written by ``ampsafe run``'s parent process (in a notebook:
    ``ampsafe.run.report.write_reports([summary()], dir)``). A bad value raises
    :class:`ampsafe.ConfigError` naming it, and the options in force stay as they were.
    """
    options = RunOptions(
        on_floor=on_floor,
        min_scale=min_scale,
        watch=watch,
        quiet=quiet,
        max_skips=max_skips,
        on_bad_target=on_bad_target,
        report=report,
        emulate_fp16=emulate_fp16,
        metrics=metrics,
        tensorboard=tensorboard,
        headroom_every=headroom_every,
        underflow=underflow,
    )
    return install_options(options)


def install_options(options: RunOptions) -> RunOptions:
    """:func:`install` with the options as one value (what ``ampsafe run``'s child reads from its environment)."""
    with LOCK:
        session = current()
        if session is not None and session.open and session.options == options:
            return options
        if session is not None and session.open:
            session.__exit__(None, None, None)
        RunSession(options, scalers=session.scalers if session is not None else None).__enter__()
        return options


def uninstall() -> None:
    """Undo everything the run put in place (every patch and hook in its ledger, the emulators it installed) and
    drop pending hooks (registered necks stay registered)."""
    with LOCK:
        session = current()
        if session is not None and session.open:
            session.__exit__(None, None, None)


def installed() -> bool:
    session = current()
    return session is not None and session.open


def summary() -> dict:
    """What ampsafe changed, and per scaler created: its class, framework, the script's own arguments and stats
    (a :class:`~ampsafe.run.records.RunSummary` as JSON holds it)."""
    return _summary().to_dict()


def _write_report() -> None:
    session = current()
    if session is not None:
        write_report(session)


def install_from_env() -> RunOptions:
    """Install with ``ampsafe run``'s options (``AMPSAFE_RUN_OPTIONS``), and write this process's summary at exit."""
    options = install_options(RunOptions.from_env())
    mark_loaded()
    at_exit(_write_report)
    write_report_on_sigterm(current)
    return options
