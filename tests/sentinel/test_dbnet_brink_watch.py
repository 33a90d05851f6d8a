"""DBNet (the seed report's model) at its brink checkpoint: watch names the first op that overflows float16,
and the headroom monitor warns while FP32 training drives the activations towards 65504."""

from __future__ import annotations

import pytest

import ampsafe

pytest.importorskip("paddle")

pytestmark = pytest.mark.trajectory


@pytest.fixture(scope="module")
def brink(brink_seed):
    from ampsafe_lab.workloads.dbnet.brink import brink_record, brink_workload

    return brink_workload(brink_seed), brink_record(brink_seed)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_brink_overflow_is_named_at_the_heads_first_conv(brink, level):
    from ampsafe.paddle.emulate import emulate_fp16

    workload, record = brink
    batch = workload.batch(0)
    with ampsafe.watch(workload.model, on_nonfinite="record") as w, emulate_fp16(workload.model, level=level):
        workload.loss(batch).backward()
    for p in workload.model.parameters():
        p.clear_gradient()
    assert len(w.events) == 1
    err = w.events[0]
    # measured at both levels on this checkpoint: head.binarize.conv1 (float32 |x| = 7.6e4 at the crossing
    # step) overflows before anything downstream, the step function's exp included
    assert (err.phase, err.module, err.op, err.kind) == ("forward", record["first_layer"], "conv2d", "overflow")
    assert err.module == "head.binarize.conv1" and err.stats["rerun_float32_finite"] is True


@pytest.mark.slow
def test_monitor_warns_before_dbnet_training_leaves_float16_range(brink_seed):
    """The brink recipe (Adam lr 1e-2) crosses 65504 at step 10 (recorded); the margin at step 3. Monitoring
    every 5 steps warns at step 5; every 10 would see steps 0 and 10 only, i.e. after the crossing."""
    from ampsafe_lab.workloads.dbnet import build
    from ampsafe_lab.workloads.dbnet.brink import RECIPE, brink_record, layer_amax

    record = brink_record(brink_seed)
    crossed = record["crossed_step"]
    workload = build(
        brink_seed, config=RECIPE["config"], image_size=RECIPE["image_size"], batch_size=RECIPE["batch_size"]
    )
    optimizer = workload.make_optimizer(RECIPE["lr"])
    model, true_amax = workload.model, []
    with ampsafe.watch(model, monitor_every=5) as w, layer_amax(model) as probe:
        for step in range(crossed + 1):
            probe.reset()
            workload.loss(workload.batch(step)).backward()
            optimizer.step()
            optimizer.clear_grad()
            true_amax.append(max(probe.amax.values()))
            if w.warnings:
                break
    # the same trajectory the brink record measured (same seed, same batches)
    recorded = [h["max"] for h in record["history"][: len(true_amax)]]
    assert true_amax == pytest.approx(recorded, rel=1e-3)
    assert w.warnings, f"no warning; float32 abs-max per step: {true_amax}"
    first = w.warnings[0]
    assert first.step % 5 == 0 and first.step < crossed
    assert first.amax < 65504 and 0 <= first.headroom_bits < 4
    assert first.start in first.layers and "ampsafe.patch" in first.message
