"""A forward overflow whose ``inf`` dies inside one module (``ampsafe.healing.trigger``'s "swallowed" rule, second
form): DBHead's step function ``reciprocal(1 + exp(-k (shrink - thresh)))`` runs ``exp`` in float16, which passes
65504 while its float32 result (at most e^50) is finite; the reciprocal turns the inf into 0, so the head's output,
the model's output and the loss stay finite and only the gradients (0 x inf in ``exp``'s backward) are non-finite.
No module's output is non-finite, so only the sentinel's replay sees it (an origin it dropped, kind "overflow").
A bare ``GradScaler(on_floor="heal")`` heals it within 3 steps of the first overflow, islanding the head, on torch
(CPU float16 autocast, where ``exp`` follows its float16 input) and on Paddle (emulated O2, PaddleOCR's default
level, where ``exp`` is float16). A ``log(0)`` dropped the same way is no range problem and heals nothing early.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import ampsafe

K = 50.0  # DBHead's k: -k (shrink - thresh) up to 50, exp up to 5e21: float32 holds it, float16 does not


class _TorchStep(nn.Module):
    """shrink and threshold maps through sigmoids, then the step function; the threshold starts far above."""

    def __init__(self):
        super().__init__()
        self.shrink, self.thresh = nn.Linear(16, 1), nn.Linear(16, 1)
        with torch.no_grad():
            self.shrink.bias.fill_(-3.0)
            self.thresh.bias.fill_(3.0)

    def forward(self, h):
        shrink, thresh = torch.sigmoid(self.shrink(h)), torch.sigmoid(self.thresh(h))
        return torch.cat([shrink, thresh, torch.reciprocal(1 + torch.exp(-K * (shrink - thresh)))], dim=1)


class _TorchLog(nn.Module):
    """``log`` of a ReLU (-inf where it is 0, in float32 too), its lanes dropped by a ``where``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 3)

    def forward(self, h):
        z = torch.relu(self.proj(h))
        return torch.where(z > 0, torch.log(z), torch.zeros_like(z))


def _torch_net(head: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), head)


def _torch_train(net: nn.Module, steps: int, scaler) -> list[int]:
    """The usual AMP loop on one batch; the steps whose gradients were non-finite."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.rand(8, 3, generator=g)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    overflowed = []
    for step in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x)
        loss = nn.functional.l1_loss(out.float(), y)
        assert bool(torch.isfinite(loss)), f"the loss must stay finite for this case (step {step})"
        scaler.scale(loss).backward()
        if not all(bool(torch.isfinite(p.grad).all()) for p in net.parameters() if p.grad is not None):
            overflowed.append(step)
        scaler.step(optimizer)
        scaler.update()
    return overflowed


def test_torch_an_exp_overflow_dropped_inside_the_head_heals_within_3_steps_islanding_the_head():
    torch.manual_seed(0)
    net = _torch_net(_TorchStep())
    scaler = ampsafe.torch.GradScaler("cpu", on_floor="heal")
    overflowed = _torch_train(net, 8, scaler)
    assert overflowed and overflowed[0] == 0, overflowed
    (heal,) = scaler.stats.heals
    assert heal.step - overflowed[0] <= 3 and scaler.stats.floor_hits == 0, (heal, overflowed)
    assert heal.paths == ("3",), heal.paths  # the head, the module whose forward runs the exp
    assert max(overflowed) == heal.step, overflowed  # trains without an overflow after the heal
    assert scaler.get_scale() >= 2.0**15  # restored, not halved toward the floor


def test_torch_a_numerical_inf_dropped_inside_a_module_heals_nothing_early():
    torch.manual_seed(0)
    net = _torch_net(_TorchLog())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 8, generator=g)
    with torch.autocast("cpu", dtype=torch.float16):
        assert bool(torch.isfinite(net(x)).all())
    from ampsafe.healing.trigger import swallowed_module
    from ampsafe.torch.backend import BACKEND

    # the sentinel drops log(0) = -inf (float32 agrees: numerical): no swallowed range overflow to heal
    found = swallowed_module(BACKEND, net, ((x,), {}), lambda: torch.autocast("cpu", dtype=torch.float16))
    assert found is None, found


def test_torch_an_overflow_dropped_in_the_roots_own_forward_heals_nothing_early():
    # an island of the root is no AMP at all: the rule names submodules only, the floor stays the last resort
    class Root(_TorchStep):
        pass

    torch.manual_seed(0)
    net = Root()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    from ampsafe.healing.trigger import swallowed_module
    from ampsafe.torch.backend import BACKEND

    replay = lambda: torch.autocast("cpu", dtype=torch.float16)  # noqa: E731
    assert swallowed_module(BACKEND, net, ((x,), {}), replay) is None
    # the same step function one level down is found, with its op
    found = swallowed_module(BACKEND, nn.Sequential(net), ((x,), {}), replay)
    assert (found.module, found.op) == ("0", "exp"), found


def test_paddle_o2_an_exp_overflow_dropped_inside_the_head_heals_within_3_steps_islanding_the_head():
    paddle = pytest.importorskip("paddle")
    from ampsafe.paddle import GradScaler, emulate_fp16

    class Step(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.shrink, self.thresh = paddle.nn.Linear(16, 1), paddle.nn.Linear(16, 1)
            self.shrink.bias.set_value(paddle.full([1], -3.0))
            self.thresh.bias.set_value(paddle.full([1], 3.0))

        def forward(self, h):
            shrink = paddle.nn.functional.sigmoid(self.shrink(h))
            thresh = paddle.nn.functional.sigmoid(self.thresh(h))
            return paddle.concat([shrink, thresh, paddle.reciprocal(1 + paddle.exp(-K * (shrink - thresh)))], axis=1)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.body = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.LayerNorm(16), paddle.nn.ReLU())
            self.head = Step()

        def forward(self, x):
            return self.head(self.body(x))

    paddle.seed(0)
    net = Net()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=net.parameters())
    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.standard_normal((8, 8)).astype("float32"))
    y = paddle.to_tensor(rng.random((8, 3)).astype("float32"))
    scaler = GradScaler(on_floor="heal", emulated=True)
    overflowed = []
    with emulate_fp16(net, level="O2"):
        for step in range(8):
            with paddle.amp.auto_cast(level="O2"):
                out = net(x)
            loss = paddle.nn.functional.l1_loss(out.astype("float32"), y)
            assert bool(paddle.isfinite(loss)), f"the loss must stay finite for this case (step {step})"
            scaler.scale(loss).backward()
            if not all(bool(paddle.isfinite(p.grad).all()) for p in net.parameters() if p.grad is not None):
                overflowed.append(step)
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
    assert overflowed and overflowed[0] == 0, overflowed
    (heal,) = scaler.stats.heals
    assert heal.step - overflowed[0] <= 3 and scaler.stats.floor_hits == 0, (heal, overflowed)
    assert heal.paths == ("head",), heal.paths
    assert max(overflowed) == heal.step, overflowed
    assert scaler.get_loss_scaling() >= 2.0**15


def test_two_overflowing_steps_in_a_row_that_show_any_swallowed_overflow_are_due():
    # a range overflow no scale fixes, whichever module each replay saw first (PaddleOCR at O1: the thresh head's
    # conv, then the binarize head's); a step with none in between starts again
    from ampsafe.healing.trigger import HealTrigger

    trigger = HealTrigger()
    assert trigger.saw("head.thresh.conv1") is False
    assert trigger.saw("head.binarize.conv1") is True
    trigger.healed()
    assert trigger.saw("head") is False and trigger.saw(None) is False and trigger.saw("head") is False
