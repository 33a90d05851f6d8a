"""The brink checkpoint: FP32 training at lr 1e-2 pushes the head's first conv past float16's max (65504)."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from ampsafe_lab.workloads.dbnet import brink  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.trajectory,
]  # trains ~13 steps once (~40 s on 2 cores), then reads .cache/ampsafe/


@pytest.fixture(scope="module")
def dbnet_brink_record(brink_seed):
    return brink.brink_record(seed=brink_seed)


def test_brink_crosses_fp16_max_first_at_the_heads_first_conv(dbnet_brink_record):
    rec = dbnet_brink_record
    assert rec["first_layer"] in ("head.binarize.conv1", "head.thresh.conv1")
    assert 0 < rec["crossed_step"] <= 40
    maxima = [h["max"] for h in rec["history"]]
    assert all(m <= brink.FP16_MAX for m in maxima[: rec["crossed_step"]])
    assert maxima[rec["crossed_step"]] > brink.FP16_MAX
    assert maxima[-1] > 100 * maxima[0]  # a jump, not a slow drift
    # the unnormalized DBFPN concat feeding it is still inside float16's range
    assert rec["watched_at_crossing"]["neck"] < brink.FP16_MAX
    assert all(np.isfinite(h["loss"]) for h in rec["history"])


def test_brink_model_overflows_fp16_in_a_float32_forward(dbnet_brink_record, brink_seed):
    w = brink.brink_workload(seed=brink_seed)
    assert w.model.training
    with paddle.no_grad(), brink.layer_amax(w.model) as probe:
        maps = w.model(*w.example_inputs)["maps"]
    assert bool(paddle.isfinite(maps).all())
    assert probe.amax["head.binarize.conv1"] > brink.FP16_MAX
    assert probe.amax["neck"] < brink.FP16_MAX
    assert probe.amax["head.binarize.conv1"] == pytest.approx(
        dbnet_brink_record["probe"]["train"]["head.binarize.conv1"], rel=1e-4
    )


def test_brink_state_is_cached_and_loads_strictly(dbnet_brink_record, brink_seed):
    path = brink.cache_path(seed=brink_seed)
    assert path.is_file() and path.with_suffix(".json").is_file()
    state = brink.brink_state(seed=brink_seed)
    model = brink.brink_model(seed=brink_seed)
    assert list(state) == list(model.state_dict())
    for name, tensor in model.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), state[name].numpy(), err_msg=name)
