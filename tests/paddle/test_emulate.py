"""emulate_fp16: float16 storage of inputs, weights, outputs and gradients, per Paddle's own AMP rules."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
import pytest
from paddle import nn

from ampsafe.errors import ConfigError, UnsupportedModelError
from ampsafe.paddle import emulate_fp16, fp16_op_types, runs_in_fp16
from ampsafe.paddle.amp_lists import black_ops
from ampsafe.paddle.intercept import fp32_region


def _conv(value: float, bias: bool = False) -> nn.Conv2D:
    conv = nn.Conv2D(1, 1, 1, bias_attr=None if bias else False)
    conv.weight.set_value(paddle.full([1, 1, 1, 1], value))
    return conv


class ExpNet(nn.Layer):
    """conv (white) -> exp (black at O1, gray at O2)."""

    def __init__(self):
        super().__init__()
        self.conv = _conv(1.0)

    def forward(self, x):
        return paddle.exp(self.conv(x))


def test_conv_output_beyond_fp16_range_becomes_inf_and_is_finite_without():
    conv = _conv(1.0e5)
    x = paddle.ones([1, 1, 2, 2])
    assert bool(paddle.isfinite(conv(x)).all())
    with emulate_fp16(conv) as emu:
        out = conv(x)
    assert bool(paddle.isinf(out).all())
    assert "conv2d" in emu.emulated


def test_inputs_and_weights_are_rounded_through_fp16():
    conv = _conv(1.0 + 2.0**-12)  # not representable in float16: rounds to 1.0
    x = paddle.full([1, 1, 1, 1], 1.0 + 2.0**-12)
    with emulate_fp16(conv):
        out = conv(x)
    assert float(out) == 1.0
    assert float(conv(x)) != 1.0


def test_scaled_gradient_beyond_fp16_range_becomes_inf_in_backward():
    conv = _conv(1.0)
    x = paddle.ones([1, 1, 2, 2])
    with emulate_fp16(conv):
        (conv(x).sum() * 1.0e5).backward()  # d(loss)/d(conv output) = 1e5 > 65504
    assert bool(paddle.isinf(conv.weight.grad).all())
    conv.clear_gradients()
    (conv(x).sum() * 1.0e5).backward()
    assert bool(paddle.isfinite(conv.weight.grad).all())


def test_exp_runs_in_fp32_at_O1_and_in_fp16_at_O2():
    net = ExpNet()
    x = paddle.full([1, 1, 2, 2], 12.0)  # exp(12) = 162755 > 65504
    with emulate_fp16(net, level="O1") as o1:
        out1 = net(x)
    with emulate_fp16(net, level="O2") as o2:
        out2 = net(x)
    assert bool(paddle.isfinite(out1).all()) and "exp" in o1.fp32_ops and "exp" not in o1.emulated
    assert bool(paddle.isinf(out2).all()) and "exp" in o2.emulated


def test_overflowed_exp_gives_nan_gradient_at_any_loss_scale_like_dbhead_at_O2():
    net = ExpNet()
    x = paddle.full([1, 1, 2, 2], 12.0)
    for scale in (1024.0, 2.0**-120, 0.0):
        net.clear_gradients()
        with emulate_fp16(net, level="O2"):
            loss = paddle.reciprocal(1.0 + net(x)).sum()  # forward stays finite: 1 / inf = 0
            (loss * scale).backward()
        assert bool(paddle.isfinite(loss)) and bool(paddle.isnan(net.conv.weight.grad).all()), scale


def test_gray_ops_follow_their_inputs_as_paddle_promotes_them():
    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.plain, self.bn = _conv(1.0), nn.BatchNorm2D(1)
            self.biased = _conv(1.0, bias=True)

        def forward(self, x):
            a = F.relu(self.bn(self.plain(x)))  # bias-free conv -> BN -> relu: all float16 at O1
            b = F.sigmoid(self.biased(x))  # bias add with a float32 bias promotes: sigmoid in float32
            return a, b

    net = Net()
    with emulate_fp16(net, level="O1") as emu:
        net(paddle.randn([2, 1, 4, 4]))
    assert {"conv2d", "batch_norm", "relu"} <= emu.emulated
    assert "sigmoid" in emu.fp32_ops and "sigmoid" not in emu.emulated
    assert emu.counts["add"] == 0


def test_O2_casts_weights_except_what_paddle_keeps_fp32():
    net = nn.Sequential(nn.Conv2D(1, 2, 1), nn.BatchNorm2D(2), nn.LayerNorm([2, 2, 2]))
    with emulate_fp16(net, level="O2") as emu:
        pass
    assert emu.report()["fp16_params"] == 2  # conv weight and bias; BN and LayerNorm stay float32
    assert all(emu.is_fp16(p) for p in net[0].parameters())
    assert not any(emu.is_fp16(p) for p in [*net[1].parameters(), *net[2].parameters()])


def test_fp32_region_is_left_in_float32():
    conv = _conv(1.0e5)
    with emulate_fp16(conv) as emu:
        with fp32_region():
            out = conv(paddle.ones([1, 1, 2, 2]))
    assert bool(paddle.isfinite(out).all()) and not emu.emulated


def test_everything_is_restored_when_the_block_raises():
    before = (paddle.Tensor.__add__, paddle._C_ops.conv2d, paddle.matmul)
    conv = _conv(1.0)
    with pytest.raises(ValueError, match="inside"):
        with emulate_fp16(conv):
            conv(paddle.ones([1, 1, 2, 2]))
            raise ValueError("inside")
    assert (paddle.Tensor.__add__, paddle._C_ops.conv2d, paddle.matmul) == before
    assert float(conv(paddle.full([1, 1, 1, 1], 1.0e5))) == 1.0e5


def test_lists_come_from_the_installed_paddle():
    from paddle.amp import amp_lists

    assert fp16_op_types("O1") == set(amp_lists.white_list()["float16"]["O1"])
    assert "conv2d" in fp16_op_types("O1")
    assert "depthwise_conv2d" not in fp16_op_types("O1") and "conv2d_transpose" not in fp16_op_types("O1")
    assert black_ops("O2") == frozenset(amp_lists.EXTRA_BLACK_LIST)
    assert not runs_in_fp16("interpolate", "O1") and not runs_in_fp16("interpolate", "O2")
    assert not runs_in_fp16("exp", "O1") and runs_in_fp16("exp", "O2")
    assert runs_in_fp16("conv2d", "O1") and runs_in_fp16("matmul", "O1")
    assert runs_in_fp16("add", "O1", inputs_fp16=True) and not runs_in_fp16("add", "O1")


def test_bad_level_and_non_paddle_model_are_refused():
    with pytest.raises(ConfigError, match="O1"):
        emulate_fp16(_conv(1.0), level="O3")
    with pytest.raises(UnsupportedModelError, match="paddle.nn.Layer"):
        emulate_fp16(object())


def test_O2_without_promotion_casts_float32_operands_like_paddle_2():
    conv = _conv(1.0)
    x, label = paddle.ones([1, 1, 2, 2]), paddle.full([1, 1, 2, 2], 1.0e5)
    with emulate_fp16(conv, level="O2"):
        promoted = conv(x) - label  # a float32 operand: Paddle 3 promotes the subtract to float32
    with emulate_fp16(conv, level="O2", use_promote=False) as legacy:
        cast = conv(x) - label  # Paddle 2.x O2: the label is cast to float16 (inf)
    assert float(promoted.max()) == 1.0 - 1.0e5
    assert bool(paddle.isinf(cast).all()) and "subtract" in legacy.emulated


def test_a_tracing_mode_inside_the_emulator_sees_the_tensors_the_program_sees():
    from ampsafe.paddle.intercept import OpMode, op_mode

    class Outputs(OpMode):
        def __init__(self):
            self.seen = []

        def __call__(self, op, func, args, kwargs):
            out = func(*args, **kwargs)
            self.seen.append((op, [id(a) for a in args if isinstance(a, paddle.Tensor)], out))
            return out

    net = nn.Sequential(_conv(1.0e5), nn.ReLU())
    tracer = Outputs()
    with emulate_fp16(net), op_mode(tracer):
        net(paddle.ones([1, 1, 2, 2]))
    (conv_op, _, conv_out), (relu_op, relu_inputs, relu_out) = tracer.seen
    assert (conv_op, relu_op) == ("conv2d", "relu")
    assert bool(paddle.isinf(conv_out).all())  # the tracer measures the float16 value
    assert id(conv_out) in relu_inputs  # and the dataflow edge is intact
