"""ampsafe.watch on Paddle models (float16 from ampsafe.paddle.emulate_fp16 on the CPU)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from paddle import nn

import ampsafe
from ampsafe.paddle.emulate import emulate_fp16


class LogModel(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(paddle.log(nn.functional.relu(self.fc(x))))


class ConvOverflow(nn.Layer):
    """Finite in float32; conv ``b`` leaves float16 range (its output passes 65504)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2D(3, 8, 3, padding=1)
        self.b = nn.Conv2D(8, 8, 3, padding=1)
        self.b.weight.set_value(self.b.weight * 1e3)

    def forward(self, x):
        return self.b(nn.functional.relu(self.a(x) * 50))


class SqrtModel(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(paddle.sqrt(nn.functional.relu(self.fc(x))))


def test_paddle_log_of_zero_is_numerical():
    paddle.seed(0)
    model = LogModel()
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(paddle.randn([6, 4]))
    assert (info.value.phase, info.value.module, info.value.op, info.value.kind) == ("forward", "", "log", "numerical")


@pytest.mark.parametrize("emulator_inside", [False, True])
def test_paddle_emulated_fp16_overflow_is_overflow_at_the_conv(emulator_inside):
    paddle.seed(0)
    model, x = ConvOverflow(), paddle.randn([2, 3, 8, 8])
    with paddle.no_grad():
        assert bool(paddle.isfinite(model(x)).all()) and float(model(x).abs().max()) > 65504
    with pytest.raises(ampsafe.NonFiniteError) as info:
        if emulator_inside:
            with ampsafe.watch(model), emulate_fp16(model):
                model(x)
        else:
            with emulate_fp16(model), ampsafe.watch(model):
                model(x)
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "b", "conv2d", "overflow")
    assert err.stats["rerun_float32_finite"] is True


def test_paddle_nan_input_is_input_kind_with_sample():
    paddle.seed(0)
    model = ConvOverflow()
    x = paddle.randn([3, 3, 8, 8])
    x[2, 0, 1, 1] = float("nan")
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(x)
    assert (info.value.module, info.value.op, info.value.kind, info.value.sample) == ("a", "conv2d", "input", 2)


def test_paddle_backward_nan_is_named_after_the_op_whose_backward_made_it():
    paddle.seed(0)
    model = SqrtModel()
    with ampsafe.watch(model) as w:
        loss = model(paddle.randn([6, 4])).sum()
        with pytest.raises(ampsafe.NonFiniteError) as info:
            loss.backward()
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("backward", "", "sqrt", "numerical")
    assert w.events == [err]


def test_paddle_no_hook_left_after_exit_even_on_exception(paddle_hook_census):
    paddle.seed(0)
    model = LogModel()
    before = paddle_hook_census(model)
    with ampsafe.watch(model, on_nonfinite="record", monitor_every=1):
        model(paddle.randn([6, 4])).sum().backward()
    assert paddle_hook_census(model) == before
    with pytest.raises(ampsafe.NonFiniteError), ampsafe.watch(model):
        model(paddle.randn([6, 4]))
    assert paddle_hook_census(model) == before
    with ampsafe.watch(model):
        assert paddle_hook_census(model) != before


class GuardModel(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2D(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = x / paddle.log(paddle.amax(paddle.abs(x), axis=[1, 2, 3], keepdim=True))  # max |x| == 1: x / 0
        h = self.drop(nn.functional.relu(self.bn(self.conv(x))))
        return self.fc(h.mean(axis=[2, 3]))


def test_paddle_guard_replays_and_localizes_with_batchnorm_restored():
    paddle.seed(0)
    model = GuardModel()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    rng = np.random.default_rng(0)
    batches = [paddle.to_tensor(rng.uniform(0.05, 0.95, (4, 3, 8, 8)).astype("float32")) for _ in range(3)]
    batches[2][1] = 1.0
    with ampsafe.watch(model, guard=True, on_nonfinite="record") as w:
        for step, x in enumerate(batches):
            mean_before = model.bn._mean.numpy().copy()
            loss = model(x).square().mean()
            loss.backward()
            ok = w.check(loss, replay=lambda x=x: model(x).square().mean())
            if ok:
                opt.step()
            opt.clear_grad()
            assert ok == (step != 2)
    assert [(e.phase, e.module, e.op, e.kind, e.sample) for e in w.events] == [
        ("forward", "", "divide", "numerical", 1)
    ]
    np.testing.assert_array_equal(model.bn._mean.numpy(), mean_before)


class StepFunction(nn.Layer):
    """DBHead's differentiable binarization 1 / (1 + exp(-k (P - T))), k = 50."""

    def forward(self, p, t):
        return paddle.reciprocal(1 + paddle.exp(-50 * (p - t)))


class TinyDBHead(nn.Layer):
    def __init__(self):
        super().__init__()
        self.binarize = nn.Conv2D(4, 1, 3, padding=1)
        self.thresh = nn.Conv2D(4, 1, 3, padding=1)
        self.step = StepFunction()

    def forward(self, x):
        return self.step(nn.functional.sigmoid(self.binarize(x)), nn.functional.sigmoid(self.thresh(x)))


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_step_function_exp_overflows_only_at_o2_and_is_named(level):
    paddle.seed(0)
    model = TinyDBHead()
    x = paddle.randn([2, 4, 16, 16]) * 3
    with paddle.no_grad():
        p = nn.functional.sigmoid(model.binarize(x))
        t = nn.functional.sigmoid(model.thresh(x))
        assert float((-50 * (p - t)).max()) > 11.1  # exp(11.1) > 65504: leaves float16 range
    with ampsafe.watch(model, on_nonfinite="record") as w, emulate_fp16(model, level=level):
        out = model(x)
        assert w.events == []  # 1 / (1 + inf) = 0: no later value carries the inf, the forward is not an event
        out.mean().backward()  # exp's gradient, 0 * inf, is NaN: the backward names the forward origin
    assert bool(paddle.isfinite(out).all())
    if level == "O1":  # exp is on Paddle's O1 black list: float32, finite
        assert w.events == []
    else:
        assert [(e.module, e.op, e.kind) for e in w.events] == [("step", "exp", "overflow")]
