"""ampsafe.heal on Paddle under ampsafe.paddle.emulate_fp16: fast cases on a small conv net."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import ampsafe  # noqa: E402
from ampsafe.paddle import GradScaler, emulate_fp16  # noqa: E402


def _net():
    paddle.seed(0)
    nn = paddle.nn
    return nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(), nn.Conv2D(8, 1, 1))


def _train(model, batches, *, max_heals=3):
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=4.0, min_loss_scaling=1.0, on_floor="heal", emulated=True)
    ampsafe.heal(model, scaler=scaler, max_heals=max_heals)
    with emulate_fp16(model):
        for x in batches:
            loss = model(paddle.to_tensor(x)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
    return scaler


def _batches(n, hot=(), nan_sample=None):
    rng = np.random.default_rng(0)
    out = []
    for step in range(n):
        x = rng.standard_normal((4, 3, 8, 8)).astype("float32")
        if step in hot:
            x *= 1e5
        if nan_sample is not None:
            x[nan_sample, 0, 1, 1] = np.inf
        out.append(x)
    return out


def test_paddle_overflowing_first_conv_is_healed_and_bn_stats_reset():
    model = _net()
    scaler = _train(model, _batches(6, hot=(0, 1, 2)))
    (record,) = scaler.stats.heals
    assert record.step == 2 and record.paths[0] == "0" and record.scale_after == 4.0
    assert ampsafe.patching.protection_of(model[0]) == "island"
    assert np.isfinite(model[1]._mean.numpy()).all() and np.isfinite(model[1]._variance.numpy()).all()
    assert scaler.stats.overflow_steps == 3  # nothing overflows after the heal


def test_paddle_nonfinite_input_is_data_not_healed_and_never_a_floor():
    model = _net()
    # from step 1 (the scaler resolves its model at step 0's step()) each inf batch is a data step: scale kept
    scaler = _train(model, _batches(4, nan_sample=2))
    stats = scaler.stats
    assert stats.input_steps == 3 and stats.floor_hits == 0 and not stats.heals
    assert float(scaler.get_loss_scaling()) == 2.0  # step 0 was still read as an overflow: 4 -> 2, then kept
    assert ampsafe.patching.patched_modules(model) == {}
