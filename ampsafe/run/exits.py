"""How the script ended, and the child's summary written at exit.

Why: a run that stops early must say why in its report. ``sys.excepthook`` notes the error that ended it;
``sys.exit`` notes the script's own exit status and where it asked for it (torchvision's engine exits 1 on a
non-finite loss before any optimizer step). Both are patched through the run's ledger, so ``uninstall`` puts
them back. At exit (``atexit``, ``ampsafe run``'s child), :func:`write_report` writes ``<pid>.json``.

A script that stops itself with a failing status is explained inside its ``sys.exit`` call, before
``SystemExit`` unwinds (:func:`explain_exit`): the FP32 guard's replay of the last forward needs the model, and
a script that holds it as a local (torchvision's reference: a local of ``main()``) frees it while unwinding,
long before ``atexit``. The guards hold their models weakly, so after the unwinding there is nothing to replay.

The at-exit summary runs before the frameworks' own exit cleanups (:func:`at_exit`, :func:`keep_at_exit_first`):
``atexit`` runs its callbacks last-registered first, and Paddle registers ``clear_device_manager`` and
``clear_kernel_factory`` when it is imported, after ``ampsafe run``'s child installed; the replay of a forward
after those ran dies on SIGSEGV in Paddle's first op.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
from typing import Callable

from ..core.ledger import AttrPatches
from .options import ENV_REPORT
from .records import Ended

__all__ = [
    "ExitHooks",
    "explain_exit",
    "write_report",
    "write_report_on_sigterm",
    "mark_loaded",
    "LOADED",
    "at_exit",
    "keep_at_exit_first",
    "alive",
]

LOADED = ".loaded"  # ``<pid>.loaded`` in ``AMPSAFE_RUN_REPORT``: this process loaded ampsafe


class ExitHooks:
    """``sys.excepthook`` and ``sys.exit`` noting how the run ended (:attr:`ended`, None while it goes on).
    ``explain()``: called inside a failing ``sys.exit`` of the main thread, while the script's frames (and the
    models they hold) are still alive."""

    def __init__(self, explain: Callable[[], None] = lambda: None) -> None:
        self.ended: Ended | None = None
        self.raised: list[BaseException] = []  # the sentinel errors --watch raised, newest last
        self._explain = explain
        self._excepthook = sys.excepthook
        self._sys_exit = sys.exit

    def install(self, ledger: AttrPatches) -> None:
        self.ended = None
        self._excepthook, self._sys_exit = sys.excepthook, sys.exit
        ledger.set(sys, "excepthook", self.note_exception)
        ledger.set(sys, "exit", self.note_exit)

    def note_exception(self, exc_type, exc, tb) -> None:
        """``sys.excepthook``: the error that ended the run, quoted in the summary and the report."""
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self.ended = Ended(exception=self._quoted(exc_type, exc)[:500])
        self._excepthook(exc_type, exc, tb)

    def _quoted(self, exc_type, exc) -> str:
        """``Type: first line`` of the error that ended the run; a sentinel error the framework re-raised as its
        own type (its text holds the original's) is quoted as the original, the wrapper named after it."""
        first = (str(exc).splitlines() or [""])[0]
        for error in reversed(self.raised):
            own = (str(error).splitlines() or [""])[0]
            if exc is not error and own and own in str(exc):
                return f"{type(error).__name__}: {own} (re-raised as {exc_type.__name__})"
        return f"{exc_type.__name__}: {first}"

    def note_exit(self, code=None):
        """``sys.exit``: the script's own exit status and where it asked for it."""
        frame = sys._getframe(1)
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        self.ended = Ended(exit=code if code is None or isinstance(code, int) else str(code)[:500], where=where)
        failing = code is not None and not (isinstance(code, int) and code == 0)
        if failing and threading.current_thread() is threading.main_thread():
            try:
                self._explain()
            except Exception as exc:  # diagnosis only: the script's own exit goes ahead whatever happens here
                print(f"[ampsafe] could not explain the exit: {type(exc).__name__}: {exc}", file=sys.stderr)
        self._sys_exit(code)


_AT_EXIT: list[Callable[[], None]] = []  # ampsafe's own exit callbacks, kept ahead of the frameworks' cleanups


def at_exit(callback: Callable[[], None]) -> None:
    """``atexit.register(callback)``, moved ahead of every exit cleanup registered later by
    :func:`keep_at_exit_first`."""
    _AT_EXIT.append(callback)
    atexit.register(callback)


def keep_at_exit_first() -> None:
    """Register ampsafe's exit callbacks again, so that they run before every cleanup registered so far (call it
    right after a framework's import, which registers its own)."""
    for callback in _AT_EXIT:
        atexit.unregister(callback)
        atexit.register(callback)


def explain_exit(guards: list) -> None:
    """The script stopped with a forward no optimizer step followed: replay it once in float32 (FP32 guard)."""
    from .target_hooks import replaying

    if any(g.exit_origin for g in guards):
        return
    with replaying():
        for guard in guards:
            if guard.explain_exit() is not None:
                return


def write_report(session, *, explain: bool = True) -> None:
    """``<pid>.json`` in ``AMPSAFE_RUN_REPORT``: the summary of ``session`` (a
    :class:`~ampsafe.run.session.RunSession`), when it is still installed. Written whole or not at all (a
    temporary file renamed into place), so the parent never reads half a summary. ``explain=False``: no replay
    of the last forward first (a process told to stop now)."""
    directory = os.environ.get(ENV_REPORT)
    if not directory or not session.open:
        return
    if explain and not session.exits.raised:  # --watch's sentinel stopped the run: its error names the origin
        explain_exit(session.guards)
    path = os.path.join(directory, f"{os.getpid()}.json")
    try:
        with open(path + ".part", "w", encoding="utf-8") as fh:
            json.dump(session.summary().to_dict(), fh, default=repr)
        os.replace(path + ".part", path)
    except OSError as exc:
        print(f"[ampsafe] could not write the run report: {exc}", file=sys.stderr)


TERMINATED = (
    "SIGTERM: the process was told to stop (torchrun and torch.multiprocessing send it to the other ranks when one "
    "ends with an error)"
)


def write_report_on_sigterm(current: Callable[[], object]) -> None:
    """A launcher that stops the other ranks when one fails (torchrun, ``torch.multiprocessing.spawn``) sends them
    SIGTERM, which ends a Python process without its exit hooks: its summary was lost. Where SIGTERM still has its
    default action (the main thread, no handler of the script's), the handler writes the summary of
    ``current()`` (the session) first, noting the signal, then ends the process by the same signal. A handler
    installed later that calls this one too (Lightning's, which lets the trainer finish its step) is in charge:
    then this one does nothing, and the process ends as that handler decides."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminated(signum, _frame) -> None:
        if signal.getsignal(signum) is not terminated:
            return
        signal.signal(signum, signal.SIG_DFL)
        try:
            session = current()
            if session is not None and session.open:
                if session.exits.ended is None:
                    session.exits.ended = Ended(exception=TERMINATED)
                write_report(session, explain=False)
        finally:
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, terminated)


def mark_loaded() -> None:
    """``<pid>.loaded`` in ``AMPSAFE_RUN_REPORT``, written at install: a process killed by a signal runs no exit
    hook and writes no summary, and the parent still knows that ampsafe was loaded (it says the command died on
    that signal, not that ampsafe never loaded)."""
    directory = os.environ.get(ENV_REPORT)
    if directory:
        try:
            open(os.path.join(directory, f"{os.getpid()}{LOADED}"), "w").close()
        except OSError:
            pass  # the marker only words the parent's message


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, which no longer runs, is not alive)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process holds the pid
        return True
    return True


def died_text(signum: int, loaded: bool) -> str:
    """``the command died on signal 11 after ampsafe loaded (SIGSEGV)``: what a negative return code means."""
    try:
        name = f" ({signal.Signals(signum).name})"
    except ValueError:
        name = ""
    return f"the command died on signal {signum}{' after ampsafe loaded' if loaded else ''}{name}"
