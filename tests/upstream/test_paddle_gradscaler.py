"""Paddle's own dygraph AmpScaler / GradScaler tests (the recorded copy ``paddle_amp_scaler_tests.py``) on the
CPU, each run against Paddle's scaler and against ampsafe's put in place of ``paddle.amp.GradScaler``,
``paddle.amp.AmpScaler`` (and the fluid-era ``fluid.dygraph.AmpScaler``), as ``ampsafe run`` does:

* ``paddle``: Paddle's own classes, built as on a GPU (on a CPU place they turn themselves off);
* ``ampsafe-neutral``: ``ampsafe.paddle.GradScaler(emulated=True, min_loss_scaling=0, max_loss_scaling=inf)``,
  Paddle-identical settings (``emulated=True``: scale on this CPU as on a GPU);
* ``ampsafe-default``: ``ampsafe.paddle.GradScaler(emulated=True)`` with its floor 1 and cap 2**24.

The AmpScaler spelling keeps AmpScaler's own defaults (``ampsafe.paddle.scaler.amp_scaler``). Every test passes in
all three; ``DEFAULT_NOTES`` would list where the defaults differ inside a passing test (none do here).
"""

from __future__ import annotations

import paddle
import paddle.amp.grad_scaler as grad_scaler
import paddle_amp_scaler_tests as upstream
import pytest
from paddle_harness import float16_amp_dtype, fluid, on_a_gpu_place

import ampsafe.paddle
from ampsafe.paddle.scaler import amp_scaler

NEUTRAL = {"min_loss_scaling": 0.0, "max_loss_scaling": float("inf")}
DEFAULT_NOTES: dict = {}  # test name -> what differs at ampsafe's defaults, and why (one line each)


class NeutralGradScaler(ampsafe.paddle.GradScaler):
    """ampsafe's scaler in Paddle-identical settings, scaling on this CPU as on a GPU."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"emulated": True, **NEUTRAL, **kwargs})


class DefaultGradScaler(ampsafe.paddle.GradScaler):
    """ampsafe's scaler with its defaults, scaling on this CPU as on a GPU."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"emulated": True, **kwargs})


VARIANTS = {
    "paddle": (on_a_gpu_place(grad_scaler.GradScaler), on_a_gpu_place(grad_scaler.AmpScaler)),
    "ampsafe-neutral": (NeutralGradScaler, amp_scaler(NeutralGradScaler)),
    "ampsafe-default": (DefaultGradScaler, amp_scaler(DefaultGradScaler)),
}
NAMES = sorted(n for n in vars(upstream.TestAmpScaler) if n.startswith("test_"))


@pytest.fixture
def scaler_variant(request, monkeypatch):
    gradscaler, ampscaler = VARIANTS[request.param]
    for module in (paddle.amp, grad_scaler):
        monkeypatch.setattr(module, "GradScaler", gradscaler)
        monkeypatch.setattr(module, "AmpScaler", ampscaler)
    monkeypatch.setattr(paddle, "fluid", fluid, raising=False)  # test_scale spells paddle.fluid.dygraph.AmpScaler
    with float16_amp_dtype():
        yield request.param


@pytest.mark.parametrize("scaler_variant", list(VARIANTS), indirect=True)
@pytest.mark.parametrize("name", NAMES)
def test_paddle_amp_scaler_test_passes(scaler_variant, name):
    paddle.seed(0)
    getattr(upstream.TestAmpScaler(name), name)()


def test_the_recorded_copy_holds_the_tests_the_readme_counts():
    assert len(NAMES) == 8 and set(DEFAULT_NOTES) <= set(NAMES)
