"""mmengine with ``custom_hooks=[dict(type="AmpSafeHook")]`` (the hook registered by name through the config's
``custom_imports``): the ``amp/*`` series its ``LoggerHook`` wrote through a ``TensorboardVisBackend`` (read back
from the event file) equal ``AmpOptimWrapper``'s scaler's own figures at every iteration.

The script runs under ``ampsafe run --emulate-fp16``, so ``AmpOptimWrapper`` trains in float16 on this CPU with its
own scaler (ampsafe's). Its float16 gradients overflow at the starting scale: the first steps are skipped and
backed off, so ``amp/loss_scale`` halves each step, then holds: the current scale, not ``LogProcessor``'s
window mean (which it gives every key matching ``loss``).
"""

from __future__ import annotations

import pytest
from amp_logs import last, run_emulated, scalars, scaler_figures

pytest.importorskip("mmengine")
pytest.importorskip("tensorboard")

pytestmark = pytest.mark.slow  # one trainer run under ampsafe run in a subprocess (about 20 s alone on 2 cores)
STEPS = 12


def test_amp_safe_hook_by_name_logs_the_scaler_s_figures_at_every_iteration(tmp_path):
    args = ("--work-dir", str(tmp_path / "work"), "--steps", str(STEPS))
    proc, figures, skipped = run_emulated(tmp_path, "mmengine_amp_tensorboard.py", *args)
    series = scalars(tmp_path / "work")
    assert last(series) == scaler_figures(figures)
    sampled = last(series, sampled=True)  # ampsafe run's headroom samples reach the logger too
    assert "amp/min_headroom_bits" in sampled and sampled["amp/grad_norm_unscaled"] > 0
    assert figures["total_steps"] == STEPS and 1 <= figures["skipped_steps"] < STEPS

    # iteration s logs the state after s optimizer steps: the scale the next step runs with, the skips so far
    history = figures["scale_history"] + [figures["scale"]]  # the scale each step ran with, then the final one
    assert series["amp/loss_scale"] == [(s, history[s]) for s in range(1, STEPS + 1)]
    assert series["amp/skipped_steps"] == [(s, float(sum(k < s for k in skipped))) for s in range(1, STEPS + 1)]
