"""What a heal costs: the model runs at most twice (the sentinel's replay at the floor and one scan of the batch),
plus one backward only when the verdict is a backward overflow and a ``loss_fn`` lets the scan measure it.
Counted with the frameworks' own hooks on the scaler's model (:mod:`heal_counts`), on the bare-scaler nets."""

from __future__ import annotations

import numpy as np
import pytest
from bare_models import HOT, paddle_nets, torch_nets
from heal_counts import heal_costs

import ampsafe


def _torch_train(scaler, model, steps: int, loss_of):
    import torch

    opt = torch.optim.SGD(model.net.parameters(), lr=1e-12)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 16, generator=g) * (HOT if step >= 2 else 1.0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_of(x)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)


def test_torch_forward_overflow_heal_runs_the_model_twice_and_no_backward():
    pytest.importorskip("torch")
    import torch

    model = torch_nets()
    scaler = ampsafe.torch.GradScaler("cpu", init_scale=4.0, on_floor="heal")
    with heal_costs() as costs:
        _torch_train(scaler, model, 6, lambda x: model(x, torch.zeros(8, 1)))
    (heal,) = costs.heals
    assert heal.method == "_heal_at_floor" and "big" in scaler.stats.heals[0].paths
    assert heal.forwards == 2 and heal.backwards == 0, costs.calls  # the sentinel's replay and the scan


def test_torch_backward_overflow_heal_with_loss_fn_adds_one_backward_not_a_forward():
    pytest.importorskip("torch")
    model = torch_nets()
    scaler = ampsafe.torch.GradScaler("cpu", init_scale=4.0, on_floor="heal")
    loss_fn = lambda out: out.float().sum() * 1e5  # noqa: E731 - finite forward; d(loss)/d(out) overflows float16
    ampsafe.heal(model.net, scaler=scaler, loss_fn=loss_fn, target="cpu")
    with heal_costs() as costs:
        _torch_train(scaler, model, 5, lambda x: loss_fn(model.net(x / HOT)))  # the forward stays in range
    heal = costs.heals[0]
    assert heal.method == "_heal_at_floor" and scaler.stats.heals
    assert heal.forwards == 2 and heal.backwards == 1, costs.calls  # the replay, then one scan with the backward


def test_paddle_emulated_heal_scans_in_float32_and_runs_the_model_twice():
    """Under an open ``emulate_fp16`` the scan pauses the emulation (its tracer predicts float16 from the level it
    is given): its output is float32 and finite, so no float32 run checks it, and the heal costs what torch's does."""
    paddle = pytest.importorskip("paddle")
    from ampsafe.paddle import GradScaler, emulate_fp16

    model = paddle_nets()
    opt = paddle.optimizer.SGD(learning_rate=1e-12, parameters=model.net.parameters())
    scaler = GradScaler(init_loss_scaling=4.0, on_floor="heal", emulated=True)
    with heal_costs() as costs, emulate_fp16(model):
        for step in range(6):
            x = np.random.default_rng(step).standard_normal((8, 16)).astype("float32")
            loss = model(paddle.to_tensor(x * (HOT if step >= 2 else 1.0)), paddle.zeros([8, 1]))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
    (heal,) = costs.heals
    assert heal.method == "_heal_at_floor" and "big" in scaler.stats.heals[0].paths
    assert heal.forwards == 2 and heal.backwards == 0, costs.calls  # the sentinel's emulated replay and the scan
