"""ampsafe.scan on Paddle inside an open ``emulate_fp16`` block (where a heal's scan runs in an emulated loop): the
emulation is paused for the scan, whose values are float32, and which float16 ops it predicts follows the level
given to the scan, not the emulator's."""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402
from paddle import nn  # noqa: E402

import ampsafe  # noqa: E402
from ampsafe.paddle import emulate_fp16  # noqa: E402

OTHER = {"O1": "O2", "O2": "O1"}


class Net(nn.Layer):
    """``big``'s output passes 65504 by about 10x on inputs of scale 300 and flows into a sum, which runs in
    float16 at O2 only: the path's amax depends on the scanned level."""

    def __init__(self):
        super().__init__()
        self.fc1, self.big, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1)
        self.big.weight.set_value(self.big.weight.numpy() * 1000.0)

    def forward(self, x):
        h = self.big(self.fc1(x))
        return self.head(nn.functional.relu(h)) + h.sum(axis=1, keepdim=True) * 1e-3


@pytest.fixture(scope="module")
def net_and_batch():
    paddle.seed(0)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype("float32") * 300.0
    return Net(), paddle.to_tensor(x)


def _facts(report):
    return [(p.start, p.risky, p.amax, p.grad_amax, p.ops, p.overflows_in) for p in report.paths]


def _scan(net, x, level):
    return ampsafe.scan(net, (x,), level=level, margin_bits=1.0, loss_fn=lambda out: out.mean(), loss_scale=1024.0)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_scan_inside_emulation_is_the_float32_scan_at_its_own_level(net_and_batch, level):
    net, x = net_and_batch
    outside = _scan(net, x, level)
    with emulate_fp16(net, level=OTHER[level]) as emu:
        inside = _scan(net, x, level)
        assert not emu.counts  # the scan's forward, loss and backward ran no op through the emulator
        y = net(x)  # the emulation is back on after the scan
    assert emu.counts["linear"] == 3 and not bool(paddle.isfinite(y).all())
    assert _facts(inside) == _facts(outside)
    big = inside.path("big")
    assert big.risky and big.overflows_in == "forward" and 65504 * 4 < big.amax < float("inf")


def test_the_scanned_level_decides_what_runs_in_float16_under_emulation(net_and_batch):
    net, x = net_and_batch
    with emulate_fp16(net, level="O1"):
        o1, o2 = _scan(net, x, "O1"), _scan(net, x, "O2")
    # at O2 the sum of big's output runs in float16 and is on its path, with a larger magnitude (about 1.4x)
    assert o2.path("big").amax > 1.2 * o1.path("big").amax
