"""The Paddle op-interception layer: layers, functionals and tensor operators are all seen, modes compose,
and nothing stays patched outside the context."""

from __future__ import annotations

import threading

import paddle
import paddle.nn.functional as F
import pytest
from paddle import nn

from ampsafe.paddle.amp_lists import black_ops, white_ops
from ampsafe.paddle.backend import BACKEND
from ampsafe.paddle.intercept import (
    OpMode,
    amp_op_type,
    current_module,
    fp32_region,
    in_fp32_region,
    module_stack,
    op_mode,
)


class Recorder(OpMode):
    def __init__(self, log=None, tag=""):
        self.ops = []
        self.log = log if log is not None else []
        self.tag = tag

    def __call__(self, op, func, args, kwargs):
        self.ops.append((current_module(), op))
        self.log.append((self.tag, op))
        return func(*args, **kwargs)


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2D(4)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.bn(self.conv(x))
        y = F.upsample(y, scale_factor=2, mode="nearest")
        y = y + y
        z = self.fc(y.mean(axis=[2, 3]))
        z = z @ paddle.ones([4, 4])
        z = paddle.matmul(z, z, transpose_y=True)
        return paddle.exp(z * 1e-3).sum()


def test_layers_functionals_and_operators_are_seen_with_their_module():
    net = Net()
    rec = Recorder()
    with op_mode(rec), module_stack(BACKEND.modules(net)):
        net(paddle.randn([2, 3, 8, 8])).backward()
    seen = set(rec.ops)
    for expected in [
        ("conv", "conv2d"),
        ("conv", "add"),  # the bias add, a separate op for Paddle's AMP
        ("bn", "batch_norm"),
        ("fc", "linear"),
        ("", "interpolate"),
        ("", "add"),
        ("", "matmul"),
        ("", "exp"),
        ("", "mean"),
        ("", "sum"),
    ]:
        assert expected in seen, f"{expected} not intercepted; saw {sorted(seen)}"
    assert sum(1 for _, op in rec.ops if op == "matmul") == 2  # x @ y and paddle.matmul


def test_depthwise_and_transposed_convs_keep_their_paddle_names():
    rec = Recorder()
    dw, up = nn.Conv2D(4, 4, 3, padding=1, groups=4), nn.Conv2DTranspose(4, 4, 2, stride=2)
    with op_mode(rec):
        up(dw(paddle.randn([1, 4, 4, 4])))
    ops = [op for _, op in rec.ops]
    assert "depthwise_conv2d" in ops and "conv2d_transpose" in ops


def test_nothing_is_patched_outside_the_context_even_after_an_exception():
    before = (paddle.Tensor.__add__, paddle.Tensor.__matmul__, paddle._C_ops.conv2d, paddle.exp, F.sigmoid)
    with pytest.raises(RuntimeError, match="boom"):
        with op_mode(Recorder()):
            assert paddle._C_ops.conv2d is not before[2]
            raise RuntimeError("boom")
    after = (paddle.Tensor.__add__, paddle.Tensor.__matmul__, paddle._C_ops.conv2d, paddle.exp, F.sigmoid)
    assert after == before
    rec = Recorder()
    paddle.ones([2]) + paddle.ones([2])  # not recorded: no mode active
    assert rec.ops == []


def test_nested_modes_compose_innermost_first():
    log = []
    outer, inner = Recorder(log, "outer"), Recorder(log, "inner")
    with op_mode(outer):
        with op_mode(inner):
            paddle.ones([2]) * paddle.ones([2])
        paddle.ones([2]) - paddle.ones([2])
    assert log == [("inner", "mul"), ("outer", "mul"), ("outer", "subtract")]


def test_a_mode_can_change_the_result_and_its_own_ops_are_not_intercepted():
    class Doubling(OpMode):
        calls = 0

        def __call__(self, op, func, args, kwargs):
            Doubling.calls += 1
            return func(*args, **kwargs) * 2.0  # a paddle op inside the handler: must not recurse

    with op_mode(Doubling()):
        out = paddle.to_tensor([1.0]) + paddle.to_tensor([2.0])
    assert float(out) == 6.0 and Doubling.calls == 1


def test_op_mode_refuses_a_non_mode():
    from ampsafe.errors import AmpSafeError

    with pytest.raises(AmpSafeError, match="OpMode"):
        with op_mode(lambda *a: None):
            pass


def test_fp32_region_is_thread_local_and_nests():
    seen = []
    with fp32_region():
        with fp32_region():
            assert in_fp32_region()
        assert in_fp32_region()
        worker = threading.Thread(target=lambda: seen.append(in_fp32_region()))
        worker.start()
        worker.join()
    assert not in_fp32_region() and seen == [False]


def test_amp_op_type_uses_the_names_on_paddles_lists():
    assert amp_op_type("add") == "elementwise_add"
    assert amp_op_type("mul") == "elementwise_mul"  # not the white-listed legacy `mul` (fc) op
    assert amp_op_type("matmul") in white_ops("O1")
    assert amp_op_type("linear") in white_ops("O1")
    assert amp_op_type("sum") in black_ops("O1") and amp_op_type("mean") in black_ops("O1")
    assert amp_op_type("interpolate") in black_ops("O2")
    assert amp_op_type("exp") == "exp"
