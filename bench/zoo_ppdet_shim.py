"""The ``sitecustomize.py`` that bench/zoo_ppdet.py puts first on its children's ``PYTHONPATH`` (the text below is
written to a folder; nothing of PaddleDetection is edited).

1. imgaug 0.4.0 (which the tree's ``ppdet.data.source.culane`` imports) reads ``numpy.sctypes`` at import; NumPy 2
   removed it: it is set just before imgaug imports. Likewise ``numpy.float`` (removed in NumPy 1.24) just before
   the tree's ``ppdet.data.source.pose3d_cmb`` (Pose3DDataset) imports.
2. With $AMPSAFE_ZOO_STEPLOG set, every ``paddle.amp`` scaler built (Paddle's own or ampsafe's subclass) appends one
   JSON line per ``minimize`` (Paddle's own scaler: ampsafe's does not run ``AmpScaler.__init__`` and has its
   own per-step records in report.json): the loss it scaled, the scale before and after, whether Paddle's
   ``_found_inf`` was set. ppdet's ``TrainingStats.update`` (once per step, any scaler) appends the step's loss
   (its ``loss``, or ``loss_tot`` where a trainer names its total so);
   with $AMPSAFE_ZOO_STOP_AFTER=N the process exits with status 0 after the N-th step, and with
   $AMPSAFE_ZOO_STOP_AT=T (epoch seconds) with status 124 after the first step that ends past T: the run limit
   stops a run between steps, so ``ampsafe run`` still writes its report at exit.
"""

from __future__ import annotations

__all__ = ["LIMIT_EXIT", "SHIM", "STEPLOG_ENV", "STOP_AT_ENV", "STOP_ENV"]

STEPLOG_ENV = "AMPSAFE_ZOO_STEPLOG"
STOP_ENV = "AMPSAFE_ZOO_STOP_AFTER"
STOP_AT_ENV = "AMPSAFE_ZOO_STOP_AT"
LIMIT_EXIT = 124  # a run stopped by its time limit, between steps or by run_group's timeout

SHIM = r'''"""Written by bench/zoo_ppdet_shim.py: numpy.sctypes for imgaug, numpy.float for Pose3DDataset, and a
per-step scaler log."""
import json
import os
import sys
import time


from bench.import_hooks import install  # the checkout is on the children's PYTHONPATH
from bench.numpy2 import set_sctypes as _numpy_sctypes


def _float(value):
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None


def _scale_of(scaler):
    get = getattr(scaler, "get_loss_scaling", None)
    if callable(get):
        return _float(get())
    return _float(getattr(scaler, "_scale", None))


def _instrument(scaler, path):
    state = {"step": 0, "loss": None}
    original_scale, original_minimize = scaler.scale, scaler.minimize

    def scale(var, *args, **kwargs):
        state["loss"] = _float(var)
        return original_scale(var, *args, **kwargs)

    def minimize(optimizer, *args, **kwargs):
        before = _scale_of(scaler)
        error = None
        try:
            out = original_minimize(optimizer, *args, **kwargs)
        except BaseException as exc:
            error, out = exc, None
        found = getattr(scaler, "_found_inf", None)
        record = {
            "step": state["step"],
            "loss": state["loss"],
            "scale_before": before,
            "scale": _scale_of(scaler),
            "found_inf": None if found is None else bool(_float(found)),
            "enabled": bool(getattr(scaler, "_enable", True)),
            "kind": "scaler",
            "class": type(scaler).__module__ + "." + type(scaler).__name__,
        }
        if error is not None:
            record["error"] = type(error).__name__ + ": " + str(error)[:300]
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        state["step"] += 1
        if error is not None:
            raise error
        return out

    scaler.scale, scaler.minimize = scale, minimize


def _wrap_scaler(module):
    path = os.environ.get("AMPSAFE_ZOO_STEPLOG")
    if not path:
        return
    cls = module.AmpScaler
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not getattr(self, "_zoo_instrumented", False):
            self._zoo_instrumented = True
            _instrument(self, path)

    cls.__init__ = __init__


def _wrap_stats(module):
    """ppdet's Trainer updates its TrainingStats with the step's loss dict once per step, whichever scaler it
    built (ampsafe's does not run AmpScaler.__init__): the loss line, and the stop after N steps."""
    path = os.environ.get("AMPSAFE_ZOO_STEPLOG")
    if not path:
        return
    cls = module.TrainingStats
    original = cls.update
    count = {"n": 0}

    def update(self, stats):
        out = original(self, stats)
        # the step's total: "loss", or "loss_tot" (ppdet's Trainer_ARSL)
        loss = next((stats.get(k) for k in ("loss", "loss_tot") if k in stats), None) if hasattr(stats, "get") else None
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "stats", "step": count["n"], "loss": _float(loss)}) + "\n")
        count["n"] += 1
        if count["n"] == int(os.environ.get("AMPSAFE_ZOO_STOP_AFTER") or 0):
            sys.exit(0)
        if time.time() >= float(os.environ.get("AMPSAFE_ZOO_STOP_AT") or "inf"):
            sys.exit(124)
        return out

    cls.update = update


def _numpy_float():
    """``numpy.float`` (the builtin float; NumPy 1.24 removed the alias) for the tree's Pose3DDataset, whose
    get_mask builds its mask with ``dtype=np.float``."""
    import numpy

    if "float" not in vars(numpy):
        numpy.float = float


install(
    before={"imgaug": _numpy_sctypes, "ppdet.data.source.pose3d_cmb": _numpy_float},
    after={"paddle.amp.grad_scaler": _wrap_scaler, "ppdet.utils.stats": _wrap_stats},
)
'''
