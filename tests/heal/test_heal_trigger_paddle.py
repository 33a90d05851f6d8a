"""Paddle's side of ``test_heal_trigger.py``: a conv's emulated float16 ``inf`` swallowed by a frozen BatchNorm
and a ReLU (finite loss, only the BatchNorm's weight gradient non-finite) is named by ``ampsafe.watch``, which
leaves no hook behind after raising, and healed by a bare ``GradScaler(on_floor="heal")`` within 3 steps of the
first overflow, islanding only the conv's path."""

from __future__ import annotations

import gc

import numpy as np
import paddle
import pytest

import ampsafe
from ampsafe.errors import NonFiniteError
from ampsafe.paddle import GradScaler, emulate_fp16
from ampsafe.paddle.watch import Watch


class _Net(paddle.nn.Layer):
    """stem (conv -> BatchNorm -> ReLU) -> conv -> pool -> fc, the stem's BatchNorm frozen (eval mode)."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1, bias_attr=False)
        self.bn = paddle.nn.BatchNorm2D(8)
        self.relu = paddle.nn.ReLU()
        self.conv2 = paddle.nn.Conv2D(8, 4, 3, padding=1)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.fc = paddle.nn.Linear(4, 2)

    def forward(self, x):
        h = self.relu(self.bn(self.conv(x)))
        return self.fc(self.pool(self.conv2(h)).flatten(1))


def _net() -> _Net:
    paddle.seed(0)
    net = _Net()
    weight = np.random.default_rng(0).uniform(0.5, 1.0, net.conv.weight.shape).astype("float32") * 5e3
    net.conv.weight.set_value(weight)  # |output| up to ~7e4 on inputs in [0, 1): inf in float16
    net.bn.weight.set_value(-np.ones(8, "float32"))  # inf -> -inf, which the ReLU zeroes
    net.bn._variance.set_value(np.full(8, 1e10, "float32"))  # trained statistics that bring 7e4 back to about 1
    net.bn.eval()
    return net


def _batch():
    rng = np.random.default_rng(1)
    x = rng.random((4, 3, 16, 16)).astype("float32")
    return paddle.to_tensor(x), paddle.to_tensor(rng.standard_normal((4, 2)).astype("float32"))


def _loss(net, x, y):
    with paddle.amp.auto_cast():
        out = net(x)
    return paddle.nn.functional.mse_loss(out.astype("float32"), y)


def _live_watches() -> int:
    gc.collect()
    return sum(isinstance(o, Watch) for o in gc.get_objects())


def test_watch_names_the_swallowed_conv_and_leaves_no_watch_alive():
    before = _live_watches()

    def watched() -> NonFiniteError:
        net = _net()
        x, y = _batch()
        with pytest.raises(NonFiniteError) as caught:
            with emulate_fp16(net), ampsafe.watch(net):
                loss = _loss(net, x, y)
                assert bool(paddle.isfinite(loss)), "the loss must stay finite for this case"
                loss.backward()
        return caught.value

    err = watched()
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "conv", "conv2d", "overflow"), err
    del err
    assert _live_watches() == before  # its gradient hooks are removed on exit: nothing keeps it alive


def test_a_swallowed_forward_overflow_heals_within_3_steps_islanding_only_the_convs_path():
    net = _net()
    x, y = _batch()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=net.parameters())
    scaler = GradScaler(on_floor="heal", emulated=True)
    overflowed = []
    with emulate_fp16(net):
        for step in range(8):
            scaler.scale(_loss(net, x, y)).backward()
            grads = [p.grad for p in net.parameters() if p.grad is not None]
            if not all(bool(paddle.isfinite(g).all()) for g in grads):
                overflowed.append(step)
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
    assert overflowed and overflowed[0] == 0, overflowed
    (heal,) = scaler.stats.heals
    assert heal.step - overflowed[0] <= 3 and scaler.stats.floor_hits == 0, (heal, overflowed)
    assert set(heal.paths) == {"conv"}, heal.paths  # the conv whose float16 inf was swallowed: its path peaks there
    assert max(overflowed) == heal.step  # no overflow after the heal
