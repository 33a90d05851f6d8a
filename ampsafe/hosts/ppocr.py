"""PaddleOCR (``tools/train.py``): the AMP-safe necks registered in its registry, and the ``amp/*`` metrics in its
``TrainingStats``, under ``ampsafe run``.

Why the necks at import: a config the run (or ``ampsafe swap-neck``) swapped names a safe neck class, which
PaddleOCR's ``build_neck`` finds only once it is registered in ``ppocr.modeling.necks``. Why the stats: its train
log line and its logger list (``log_metrics`` of its ``Loggers``) are built from ``TrainingStats.get``
(:func:`~ampsafe.hosts._install.training_stats`).
"""

from __future__ import annotations

from . import Host
from ._install import training_stats

__all__ = ["register_necks", "dynamic_scale_fix", "HOST"]


def register_necks(session, module) -> None:
    """Register the safe necks in ``ppocr.modeling.necks``; the line goes to the banner and the changes."""
    from ..patches import register_paddleocr
    from ..patches.register import ppocr_registration_line

    done = register_paddleocr()
    if done.get("ppocr"):
        session.changes.append(f"safe necks registered in PaddleOCR's ppocr: {', '.join(sorted(done['ppocr']))}")
        session.say(ppocr_registration_line(done))


def dynamic_scale_fix(scale: float) -> dict:
    """PaddleOCR's words for a dynamic loss scale from ``scale``: the two ``Global`` keys its ``tools/train.py``
    reads into ``paddle.amp.GradScaler(init_loss_scaling=scale_loss, use_dynamic_loss_scaling=...)`` (defaults
    1.0 and False: with ``use_amp: True`` alone the scale is fixed at 1), as YAML keys and as ``-o`` overrides
    (with where they go: PaddleOCR reads only the last ``-o`` of a command)."""
    config = {"Global.use_dynamic_loss_scaling": "True", "Global.scale_loss": f"{float(scale):g}"}
    return {
        "trainer": "PaddleOCR",
        "source": "PaddleOCR's Global.scale_loss / Global.use_dynamic_loss_scaling (defaults 1.0 / False)",
        "config": config,
        "overrides": "-o " + " ".join(f"{k}={v}" for k, v in config.items()),
        # tools/program.py's ArgsParser takes -o with nargs="+": a second -o replaces the first
        "overrides_note": "the pairs go into the command's one -o list: PaddleOCR keeps only its last -o",
    }


HOST = Host(
    "ppocr",
    registers={"ppocr.modeling.necks": register_necks},
    loggers={"ppocr.utils.stats": training_stats},
    static_scale=dynamic_scale_fix,
)
