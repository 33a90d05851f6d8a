"""``ampsafe run``'s ``amp/*`` metrics in the loggers a script already feeds, with zero edits to the script.

Each trainer gets the integration object a user would add by hand (:mod:`ampsafe.integrations`), once the
trainer is built (its ``__init__`` wrapped, recorded in the run's ledger), unless the script added one itself:

===========================  ==================================================================================
HF ``Trainer``               ``integrations.hf.add_callback(trainer)``: ahead of the ``report_to`` callbacks
Lightning ``Trainer``        ``AmpMetricsCallback`` appended to ``trainer.callbacks`` (when it has a logger)
mmengine ``Runner``          ``AmpSafeHook`` registered on the runner (its ``MessageHub``: every vis backend)
ultralytics ``BaseTrainer``  the ``on_train_epoch_end`` callback, first: its loggers and results.csv get it
PaddleOCR / PaddleDetection  ``TrainingStats.get`` gains the keys: the train log line and the logger list
                             (``log_metrics`` of PaddleOCR's ``Loggers``; ppdet's VisualDL / W&B callbacks)
a plain loop                 ``--tensorboard DIR``: every scaler of the run writes an event file at each step
===========================  ==================================================================================

Why at construction: each integration reads the trainer's own scaler when it logs (accelerate's, the precision
plugin's, the optimizer wrapper's ``loss_scaler``, ``trainer.scaler``), so nothing here holds a scaler or a model:
PaddleOCR's and ppdet's stats read the run's latest Paddle scaler at each ``get``, the ``--tensorboard`` writer
holds its scaler weakly. Everything here is host-side reads at the trainer's own logging calls: no forward, no
collective (a DeepSpeed or FSDP run logs what each rank's scaler holds, or nothing where it has none).
"""

from __future__ import annotations

import atexit
import functools
import os
import weakref

__all__ = ["install", "tensorboard", "TARGETS"]

# module whose import installs -> installer (_INSTALL)
TARGETS = {
    "transformers.trainer": "hf",
    "lightning.pytorch.trainer.trainer": "lightning",
    "pytorch_lightning.trainer.trainer": "lightning",
    "mmengine.runner.runner": "mmengine",
    "ultralytics.engine.trainer": "ultralytics",
    "ppocr.utils.stats": "stats",
    "ppdet.utils.stats": "stats",
}


def install(session) -> None:
    """Hook every trainer of :data:`TARGETS` when its module is imported (now, for those already imported)."""
    for target, kind in TARGETS.items():
        session.finder.when_imported(target, lambda module, _kind=kind: _INSTALL[_kind](session, module))


def _after_init(session, cls, add, label: str) -> None:
    """Wrap ``cls.__init__`` so that ``add(self)`` runs once the object is built; a failure is one banner line."""
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


def _hf(session, module) -> None:
    from ..integrations import hf

    def add(trainer):
        kind = hf._callback_class()
        if any(isinstance(cb, kind) for cb in trainer.callback_handler.callbacks):
            return None
        hf.add_callback(trainer)
        return "AmpCallback, ahead of the report_to callbacks"

    _after_init(session, module.Trainer, add, "HF Trainer")


def _lightning(session, module) -> None:
    from ..integrations import lightning

    package = module.__name__.split(".trainer.")[0]

    def add(trainer):
        kind = lightning.callback_class(package)
        if not trainer.loggers or any(isinstance(cb, kind) for cb in trainer.callbacks):
            return None
        trainer.callbacks.append(kind())
        return "AmpMetricsCallback"

    _after_init(session, module.Trainer, add, "Lightning Trainer")


def _mmengine(session, module) -> None:
    from ..integrations import mmengine

    def add(runner):
        kind = mmengine.register()
        if any(isinstance(hook, kind) for hook in runner.hooks):
            return None
        runner.register_hook(kind())
        return "AmpSafeHook"

    _after_init(session, module.Runner, add, "mmengine Runner")


def _ultralytics(session, module) -> None:
    from ..integrations import ultralytics

    def add(trainer):
        callbacks = trainer.callbacks.setdefault("on_train_epoch_end", [])
        if any(getattr(cb, "__module__", None) == ultralytics.__name__ for cb in callbacks):
            return None
        callbacks.insert(0, ultralytics.epoch_end_callback())  # ahead of the logger callbacks the trainer added
        return "on_train_epoch_end callback"

    _after_init(session, module.BaseTrainer, add, "ultralytics trainer")


def _stats(session, module) -> None:
    """PaddleOCR's and ppdet's ``TrainingStats.get``: their train log line and their loggers read it. The
    amp values are the current ones (not the window's median the losses get)."""
    from ..integrations.metrics import amp_metrics

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


_INSTALL = {"hf": _hf, "lightning": _lightning, "mmengine": _mmengine, "ultralytics": _ultralytics, "stats": _stats}


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
