"""What the hosts' ``ampsafe run`` installers share: adding a logger object once a trainer is built, and the
``amp/*`` keys in a Paddle trainer's ``TrainingStats``.

Why at construction: each logger object reads the trainer's own scaler when it logs (accelerate's, the
precision plugin's, the optimizer wrapper's ``loss_scaler``, ``trainer.scaler``), so nothing here holds a scaler
or a model; PaddleOCR's and ppdet's stats read the run's latest Paddle scaler at each ``get``. Everything is
host-side reads at the trainer's own logging calls: no forward, no collective (a DeepSpeed or FSDP run logs what
each rank's scaler holds, or nothing where it has none).
"""

from __future__ import annotations

import functools

from ..integrations.metrics import amp_metrics

__all__ = ["after_init", "training_stats"]


def after_init(session, cls, add, label: str) -> None:
    """Wrap ``cls.__init__`` so that ``add(self)`` runs once the object is built (it returns what it added, or
    None when the script added one itself); a failure is one banner line."""
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            added = add(self)
        except Exception as exc:  # noqa: BLE001 - the metrics are extra: training goes on without them
            session.say(f"amp/* metrics not added to {label}: {type(exc).__name__}: {exc}")
            return
        if added:
            line = f"amp/* metrics added to {label}'s loggers ({added})"
            if line not in session.changes:
                session.changes.append(line)
                session.say(line)

    session.set_attr(cls, "__init__", __init__)


def training_stats(session, module) -> None:
    """PaddleOCR's and ppdet's ``TrainingStats.get`` (the same class in both): their train log line and their
    loggers read it. The amp values are the current ones (not the window's median the losses get)."""
    cls = module.TrainingStats
    original = cls.get

    @functools.wraps(original)
    def get(self, extras=None):
        stats = original(self, extras)
        stats.update(amp_metrics(_scaling_scaler(session)))
        return stats

    session.set_attr(cls, "get", get)
    line = f"amp/* metrics added to {module.__name__.split('.')[0]}'s training stats (its log line and loggers)"
    session.changes.append(line)
    session.say(line)


def _scaling_scaler(session):
    """The run's latest scaler that scales (the trainer's), or None."""
    for tracked in reversed(session.scalers):
        scaler = tracked.scaler
        if getattr(scaler, "disabled_reason", None) is None:
            return scaler
    return None
