"""The issue's claim for the headroom monitor: DBNet's activations jump within 20-40 Adam steps, and
``watch(model, monitor_every=10)`` still warns before float16 overflows.

The recipe is ``MONITOR_RECIPE`` in :mod:`ampsafe_lab.workloads.dbnet.brink` (Adam's lr ramped from 0 to 2e-2 over
30 steps): recipes at a constant lr plateau just below 65504 and cross on one CPU but not the next. Its measured
margins (crossing at steps 25-28, warning at step 20; bench/results/margins.md) are written beside the recipe.
"""

from __future__ import annotations

import pytest

import ampsafe

pytest.importorskip("paddle")

pytestmark = [pytest.mark.slow, pytest.mark.trajectory]

MONITOR_EVERY = 10
MAX_STEPS = 40
HEAD_FIRST_CONVS = ("head.binarize.conv1", "head.thresh.conv1")


def test_monitor_every_10_warns_before_dbnet_training_leaves_float16_range(brink_seed):
    from ampsafe_lab.workloads.dbnet.brink import FP16_MAX, train_monitor_recipe

    watches, called = [], []

    def watch(model):
        watches.append(ampsafe.watch(model, monitor_every=MONITOR_EVERY, callback=called.append))
        return watches[-1]

    amax_per_step = train_monitor_recipe(brink_seed, MAX_STEPS, watch=watch, stop_after=0)
    w = watches[0]
    peaks = [round(max(a.values())) for a in amax_per_step]
    crossed = next((s for s, a in enumerate(amax_per_step) if max(a.values()) > FP16_MAX), None)
    assert crossed is not None, f"float32 training never left float16's range in {MAX_STEPS} steps: {peaks}"
    assert MONITOR_EVERY < crossed, f"crossed at step {crossed}: too early to test monitoring every 10 steps"
    assert max(amax_per_step[0].values()) < FP16_MAX / 2**4, "the model must start with headroom to spare"

    assert w.warnings, f"no headroom warning; float32 abs-max per step: {peaks}"
    assert called == w.warnings  # the callback saw every warning (and no NonFiniteError: FP32 stays finite)
    first = w.warnings[0]
    assert first.step % MONITOR_EVERY == 0 and first.step < crossed
    assert all(x.step % MONITOR_EVERY == 0 for x in w.warnings)
    assert first.start.startswith("neck.") and set(HEAD_FIRST_CONVS) <= set(first.layers)
    assert 0 <= first.headroom_bits < first.margin_bits == 4.0 and first.amax < FP16_MAX
    # the monitor's number is the float32 abs-max of that path's layers at that step
    measured = max(amax_per_step[first.step][x] for x in first.layers if x in amax_per_step[first.step])
    assert first.amax == pytest.approx(measured, rel=1e-5)
    # and the layer that later overflows is on the path it warned about
    overflowing = [x for x, v in amax_per_step[crossed].items() if v > FP16_MAX]
    assert overflowing[0] in first.layers, f"overflowed in {overflowing}, warned about {first.layers}"
    assert repr(first.start) in first.message and "ampsafe.patch" in first.message
