"""``amp/*`` metrics of a plain training loop in a TensorBoard event file, written without TensorFlow.

Example::

    from ampsafe.integrations.tensorboard import AmpTensorBoard
    with AmpTensorBoard("runs/amp", scaler) as board:
        for step, batch in enumerate(loader):
            ...
            scaler.step(optimizer)
            scaler.update()
            board.log(step + 1)        # amp/loss_scale, amp/skipped_steps, ... after `step + 1` optimizer steps

Works for torch and Paddle scalers alike (:func:`ampsafe.integrations.metrics.amp_metrics`). The event file is
written with the ``tensorboard`` package's own writer (the one ``torch.utils.tensorboard`` uses, which needs
neither TensorFlow nor torch), else with ``tensorboardX``; both are extras (``pip install ampsafe[tensorboard]``),
imported only when an ``AmpTensorBoard`` is built. ``tensorboard --logdir runs`` shows the scalars.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import MissingFrameworkError
from .metrics import amp_metrics

__all__ = ["AmpTensorBoard"]


class AmpTensorBoard:
    """One event file in ``logdir`` with the ``amp/*`` scalars of ``scaler`` at each :meth:`log` call."""

    def __init__(self, logdir: str, scaler: Any) -> None:
        self.logdir = str(logdir)
        self.scaler = scaler
        self._write, self._flush, self._close = _event_writer(self.logdir)

    def log(self, step: int) -> dict[str, float]:
        """Write the scaler's ``amp/*`` metrics at ``step``; returns what was written."""
        metrics = amp_metrics(self.scaler)
        self.write(step, metrics)
        return metrics

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write any ``name -> value`` scalars at ``step`` (a loss beside the amp metrics, say)."""
        self._write(int(step), {name: float(value) for name, value in scalars.items()})

    def flush(self) -> None:
        self._flush()

    def close(self) -> None:
        self._close()

    def __enter__(self) -> AmpTensorBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _event_writer(logdir: str):
    """(write(step, scalars), flush(), close()) over the ``tensorboard`` package's event writer, else
    tensorboardX's ``SummaryWriter``."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        pass
    else:
        writer = EventFileWriter(logdir)

        def write(step: int, scalars: dict[str, float]) -> None:
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
            writer.add_event(
                event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
            )

        return write, writer.flush, writer.close
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise MissingFrameworkError(
            "AmpTensorBoard writes TensorBoard event files with the tensorboard package (or tensorboardX): "
            "pip install 'ampsafe[tensorboard]'"
        ) from None
    board = SummaryWriter(logdir)

    def write_x(step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            board.add_scalar(tag, value, step)

    return write_x, board.flush, board.close
