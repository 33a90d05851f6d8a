"""A bare ampsafe.paddle.GradScaler (no ampsafe.heal call, no model=) under emulate_fp16: it resolves its model,
replays the last batch in the step's emulated float16 at the floor, and heals or raises with what it measured."""

from __future__ import annotations

import logging
import math

import numpy as np
import paddle
import pytest
from bare_models import HOT, paddle_nets

import ampsafe
from ampsafe.paddle import GradScaler, emulate_fp16
from ampsafe.patching import patched_modules


def _batch(step: int, hot_from: int = 2, n: int = 8):
    x = np.random.default_rng(step).standard_normal((n, 16)).astype("float32")
    return paddle.to_tensor(x * (HOT if step >= hot_from else 1.0)), paddle.zeros([n, 1])


def _train(scaler, steps: int, *, hot_from: int = 2, poison=None):
    model = paddle_nets()
    opt = paddle.optimizer.SGD(learning_rate=1e-12, parameters=model.net.parameters())
    losses = []
    with emulate_fp16(model):
        for step in range(steps):
            x, y = _batch(step, hot_from)
            if poison is not None:
                x = poison(x)
            loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            losses.append(float(loss))
    return model, losses


def test_bare_heal_scaler_islands_the_emulated_forward_overflow_and_goes_on(caplog):
    scaler = GradScaler(init_loss_scaling=4.0, on_floor="heal", emulated=True)
    with caplog.at_level(logging.WARNING, logger="ampsafe.heal"):
        model, losses = _train(scaler, 8)
    assert scaler.model is model.net
    (heal,) = scaler.stats.heals
    assert heal.step == 4 and "big" in heal.paths and heal.scale_after == 4.0
    assert patched_modules(model)["net.big"] == "island"
    assert all(math.isfinite(v) for v in losses[5:]) and scaler.get_loss_scaling() == 4.0
    assert any("ampsafe heal at step 4" in r.getMessage() for r in caplog.records)


def test_bare_raise_scaler_says_forward_and_names_the_linear_and_its_op():
    scaler = GradScaler(init_loss_scaling=4.0, emulated=True)
    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        _train(scaler, 8)
    msg = str(info.value)
    assert info.value.info.where == "forward"
    assert "the forward pass: the first non-finite value comes from big:linear" in msg
    assert "in float32 its output reaches |x| = " in msg


def test_nonfinite_input_is_data_not_a_floor():
    def poison(x):
        a = x.numpy()
        a[2, 0] = math.nan
        return paddle.to_tensor(a)

    scaler = GradScaler(init_loss_scaling=4.0, emulated=True)
    decisions = []
    scaler.add_step_callback(decisions.append)
    _train(scaler, 8, hot_from=99, poison=poison)  # no LossScaleFloorError: data never reaches the floor
    assert [d.bad_input.where for d in decisions[1:]] == ["args[0][2]"] * 7
    assert scaler.stats.input_steps == 7 and scaler.stats.floor_hits == 0 and scaler.get_loss_scaling() == 2.0


def test_minimize_resolves_and_drops_the_capture_too():
    model = paddle_nets()
    opt = paddle.optimizer.SGD(learning_rate=1e-12, parameters=model.net.parameters())
    scaler = GradScaler(init_loss_scaling=4.0, emulated=True)
    with emulate_fp16(model):
        for step in range(2):
            x, y = _batch(step)
            scaled = scaler.scale(model(x, y))
            scaled.backward()
            if step == 1:
                assert scaler.capture.latest[0][0] is x
            scaler.minimize(opt, scaled)
            opt.clear_grad()
    assert scaler.model is model.net and scaler.capture.latest is None
