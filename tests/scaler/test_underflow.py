"""Gradient underflow in float16 (``ampsafe.core.underflow``), measured on real torch and Paddle gradients: what is
counted, what a lower scale would flush, and the rise of the zero fraction when the loss scale is forced low."""

from __future__ import annotations

import pytest

from ampsafe._framework import backend_named, backend_of
from ampsafe.core.underflow import LOST_LIMIT, judge_scale, measure_underflow, model_grads

LOW, HIGH = 2.0**-10, 2.0**10


def _tensor(framework: str, values):
    fw = pytest.importorskip(framework)
    return fw.to_tensor(values, dtype="float32") if framework == "paddle" else fw.tensor(values)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_counts_what_float16_holds_and_what_a_lower_scale_flushes(framework):
    # scaled gradient values: two zeros (one rounds to zero in float16), the smallest subnormal, a subnormal, normals
    values = [0.0, 2.0**-26, 2.0**-24, 2.0**-20, 2.0**-10, 1.0, 3.0, 70000.0]
    backend = backend_named(framework)
    u = measure_underflow(backend, [("head.fc.weight", _tensor(framework, values))], 4.0, step=7)
    assert (u.step, u.scale, u.elements) == (7, 4.0, 8)
    assert u.zero == pytest.approx(2 / 8) and u.subnormal == pytest.approx(2 / 8)
    assert set(u.per_module) == {"head.fc"} and u.per_module["head.fc"] == pytest.approx((2 / 8, 2 / 8))
    # 5 non-zero finite (70000 is inf in float16); at scale 2 (half) 2**-24 lands on 2**-25: float16 rounds it to 0
    assert u.nonzero == 5
    assert u.lost_at(4.0) == 0.0 and u.lost_at(8.0) == 0.0
    assert u.lost_at(2.0) == pytest.approx(1 / 5)
    assert u.lost_at(4.0 * 2.0**-5) == pytest.approx(2 / 5)  # 2**-20 lands on 2**-25 too
    assert u.lost_at(4.0 * 2.0**-16) == pytest.approx(3 / 5)
    assert judge_scale(u, 2.0) is not None and "20.0%" in judge_scale(u, 2.0)
    assert judge_scale(u, 4.0) is None and LOST_LIMIT == 0.01


def _torch_fractions(init_scale: float):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, target = torch.randn(128, 32), torch.randn(128, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = 1e-2 * torch.nn.functional.mse_loss(out.float(), target)
    scaler.scale(loss).backward()
    backend = backend_of(model)
    return measure_underflow(backend, model_grads(backend, model), scaler.get_scale(), step=0)


def _paddle_fractions(init_scale: float):
    paddle = pytest.importorskip("paddle")
    import ampsafe

    paddle.seed(0)
    nn = paddle.nn
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 8))
    scaler = ampsafe.paddle.GradScaler(init_loss_scaling=init_scale, min_loss_scaling=2.0**-20, emulated=True)
    x, target = paddle.randn([128, 32]), paddle.randn([128, 8])
    with ampsafe.paddle.emulate_fp16(model):
        out = model(x)
        loss = 1e-2 * nn.functional.mse_loss(out.astype("float32"), target)
        scaler.scale(loss).backward()
    backend = backend_of(model)
    return measure_underflow(backend, model_grads(backend, model), scaler.get_loss_scaling(), step=0)


@pytest.mark.parametrize("fractions", [_torch_fractions, _paddle_fractions], ids=["torch", "paddle"])
def test_zero_fraction_rises_when_the_scale_is_forced_low(fractions):
    low, high = fractions(LOW), fractions(HIGH)
    assert (low.scale, high.scale) == (LOW, HIGH)
    assert low.elements == high.elements == 32 * 128 + 128 + 128 * 8 + 8
    # at 2**10 float16 holds nearly every element; at 2**-10 a large part rounds to zero (measured: ~0% vs >20%)
    assert high.zero < 0.01 and high.subnormal < 0.05
    assert low.zero > 0.1 and low.zero > 20 * max(high.zero, 1e-3)
    assert low.zero + low.subnormal > 0.5
    # the high scale's histogram judges the low one: it names the loss, a lower bound of what the low run lost
    assert 0.05 < high.lost_at(LOW) <= low.zero + 0.05
    assert judge_scale(high, LOW) is not None and judge_scale(high, HIGH / 2) is None
