"""PaddleDetection (ppdet, ``tools/train.py``): the AMP-safe necks registered in its workspace, and the ``amp/*``
metrics in its ``TrainingStats``, under ``ampsafe run``.

Why the necks at import: a config the run (or ``ampsafe swap-neck``) swapped names a safe neck class, which
ppdet's ``create`` finds only once it is registered. Why the stats: its ``LogPrinter`` line and its VisualDL /
W&B callbacks read ``TrainingStats.get`` (:func:`~ampsafe.hosts._install.training_stats`).
"""

from __future__ import annotations

from . import Host
from ._install import training_stats

__all__ = ["register_necks", "HOST"]


def register_necks(session, module) -> None:
    """Register the safe necks in ppdet; the line goes to the banner and the changes."""
    from ..patches import register_paddledet

    names = register_paddledet()
    session.changes.append(f"ppdet necks registered: {', '.join(names)}")
    session.say(f"ppdet necks registered: {', '.join(names)}")


HOST = Host(
    "ppdet",
    registers={"ppdet": register_necks},
    loggers={"ppdet.utils.stats": training_stats},
)
