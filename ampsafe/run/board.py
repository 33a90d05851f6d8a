"""``ampsafe run --tensorboard DIR``: a plain loop's ``amp/*`` metrics in an event file, with zero edits to the script.

Why per scaler, not per trainer: a plain loop has no logger ampsafe could add to (the trainers' loggers are
their hosts' part, :mod:`ampsafe.hosts`), but every scaler the run builds steps, so each writes its metrics
after its own steps. The writer holds its scaler weakly and opens its file at the first step: host-side reads
only, no forward, no collective.
"""

from __future__ import annotations

import atexit
import os
import weakref

__all__ = ["tensorboard"]


def tensorboard(session, tracked) -> None:
    """``--tensorboard DIR``: ``tracked``'s scaler writes its ``amp/*`` metrics after every optimizer step (step:
    the steps taken so far) into an event file, in ``DIR`` for the process's first scaler, ``DIR/scaler<N>`` for
    later ones, under ``DIR/rank<R>`` on a distributed rank other than 0. The file is opened at the first step."""
    from ..integrations.metrics import amp_metrics

    scaler = tracked.scaler
    if not hasattr(scaler, "add_step_callback"):
        return
    index = sum(1 for t in session.scalers if t is not tracked and t.board is not None)
    rank = os.environ.get("RANK") or os.environ.get("PADDLE_TRAINER_ID") or "0"
    folder = session.options.tensorboard
    folder = folder if rank == "0" else os.path.join(folder, f"rank{rank}")
    folder = folder if index == 0 else os.path.join(folder, f"scaler{index}")
    tracked.board = folder
    ref = weakref.ref(scaler)
    board = []

    def log(decision) -> None:
        scaler = ref()
        if scaler is None or board == [None]:
            return
        if not board:
            from ..integrations.tensorboard import AmpTensorBoard

            try:
                board.append(AmpTensorBoard(folder, None))
            except Exception as exc:  # noqa: BLE001 - the metrics are extra: training goes on without them
                board.append(None)
                session.say(f"--tensorboard: no event file in {folder}: {type(exc).__name__}: {exc}")
                return
            atexit.register(board[0].close)
        board[0].write(scaler.stats.total_steps, amp_metrics(scaler))
        board[0].flush()

    scaler.add_step_callback(log)
