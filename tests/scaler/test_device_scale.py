"""The torch scaler's device path (:mod:`ampsafe.torch.device_scale`) against the core state machine it mirrors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scaler_helpers import poison_torch_grad, torch_model

import ampsafe
from ampsafe.core.scale import LossScaleState, ScalePolicy
from ampsafe.torch import GradScaler
from ampsafe.torch.device_scale import DeviceSteps

# usual values, odd ones (the float64 product rounds to float32) and any others
FACTORS = st.one_of(st.sampled_from([2.0, 1.5, 1.7, 1.0 + 2.0**-10]), st.floats(1.0, 1e3, exclude_min=True))
BACKOFFS = st.one_of(st.sampled_from([0.5, 0.25, 0.3, 0.999]), st.floats(0.0, 1.0, exclude_min=True, exclude_max=True))
OVERFLOW_CAST = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 3e38 * 2
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # CUDA: torch's own fused kernel there
SCALES = st.sampled_from([2.0**-8, 0.1, 1.0, 3.0, 2.0**10, 1000.7, 2.0**16, 2.0**24, 3.0e38])


@st.composite
def policies(draw):
    """Random floors, caps, factors, intervals and hysteresis, with an initial scale (and trackers) in range."""
    lo, hi = sorted((draw(SCALES), draw(st.one_of(SCALES, st.just(math.inf)))))
    if draw(st.booleans()):
        lo = 0.0
    inner = st.floats(max(lo, 2.0**-24), min(hi, 3.0e38))
    init = draw(st.one_of(st.sampled_from([x for x in (lo, hi) if 0 < x < math.inf] or [1.0]), inner))
    init = min(max(init, lo), hi)
    policy = ScalePolicy(
        init_scale=init,
        growth_factor=draw(FACTORS),
        backoff_factor=draw(BACKOFFS),
        growth_interval=draw(st.integers(1, 6)),
        min_scale=lo,
        max_scale=hi,
        hysteresis=draw(st.integers(1, 4)),
        on_floor=draw(st.sampled_from(["raise", "clamp", "heal"])),
    )
    growth = draw(st.integers(0, policy.growth_interval - 1))
    overflow = draw(st.integers(0, policy.hysteresis - 1))
    return policy, growth, overflow


def _core(policy, growth, overflow) -> LossScaleState:
    core = LossScaleState(policy)
    core.growth_tracker, core.overflow_tracker = growth, overflow
    return core


def _host_view(core: LossScaleState) -> tuple:
    s = core.stats
    return float(core.scale), core.growth_tracker, core.overflow_tracker, s.skipped_steps, s.floor_hits


@pytest.mark.parametrize("dev", DEVICES)
@OVERFLOW_CAST
@settings(max_examples=200, deadline=None)
@given(policies(), st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_device_steps_equal_the_core_after_every_step(dev, drawn, steps):
    """Each element: (overflow?, reconcile after it?). After every step the device's scale, growth tracker,
    overflow (hysteresis) counter, skipped steps and floor hits equal the host core's; so does the folded state."""
    host, device_core = _core(*drawn), _core(*drawn)
    device = DeviceSteps()
    scale = torch.full((), float(device_core.scale), dtype=torch.float32, device=dev)
    for i, (overflow, reconcile) in enumerate(steps):
        host.update(overflow)
        base = device_core.stats
        device.step(device_core, scale, torch.full((), float(overflow), device=dev))
        value, growth, hysteresis, skipped, floor_hits, last_clean = device.read(scale)
        seen = (value, int(growth), int(hysteresis), base.skipped_steps + int(skipped), base.floor_hits + floor_hits)
        assert seen == _host_view(host), f"step {i}"
        assert last_clean == host.last_clean_scale, f"step {i}"
        if reconcile or i == len(steps) - 1:
            device.reconcile(device_core, scale)
            assert device.lag == 0
            assert _host_view(device_core) == _host_view(host), f"step {i}"
            assert device_core.last_clean_scale == host.last_clean_scale
            assert device_core.stats.total_steps == host.stats.total_steps
            assert float(scale) == float(host.scale)


@pytest.mark.parametrize("dev", DEVICES)
@OVERFLOW_CAST
@settings(max_examples=200, deadline=None)
@given(policies(), st.lists(st.booleans(), min_size=1, max_size=40))
def test_device_steps_are_allowed_only_where_no_floor_hit_can_hide(dev, drawn, pattern):
    """raise/heal: whenever ``allowed`` lets the device decide a step, the host core hits no floor on it."""
    host, device_core = _core(*drawn), _core(*drawn)
    device = DeviceSteps()
    scale = torch.full((), float(device_core.scale), dtype=torch.float32, device=dev)
    for overflow in pattern:
        if device.allowed(device_core):
            decision = host.update(overflow)
            device.step(device_core, scale, torch.full((), float(overflow), device=dev))
            assert not decision.floor_hit or host.policy.on_floor == "clamp" or host.policy.min_scale == 0
        else:  # the scaler's host path: catch up, then decide on the host
            device.reconcile(device_core, scale)
            host.update(overflow)
            device_core.update(overflow)
            scale.fill_(float(device_core.scale))
    device.reconcile(device_core, scale)
    assert _host_view(device_core) == _host_view(host)


def test_device_steps_grow_after_the_growth_interval_is_lowered_as_the_core_does():
    """torch's fused kernel grows only when the tracker hits the interval exactly; the core grows at >=."""
    policy = ScalePolicy(init_scale=8.0, growth_interval=5, min_scale=1.0)
    host, device_core = LossScaleState(policy), LossScaleState(policy)
    host.growth_tracker = device_core.growth_tracker = 4
    for core in (host, device_core):
        core.policy = ScalePolicy(init_scale=8.0, growth_interval=2, min_scale=1.0)
    device, scale = DeviceSteps(), torch.full((), 8.0)
    host.update(False)
    device.step(device_core, scale, torch.zeros(()))
    device.reconcile(device_core, scale)
    assert _host_view(device_core) == _host_view(host) == (16.0, 0, 0, 0, 0)


def test_a_hand_set_scale_outside_the_range_is_decided_on_the_host():
    """update(new_scale) may leave the scale above max_scale; the core keeps it there on a clean step."""
    core = LossScaleState(ScalePolicy(init_scale=8.0, growth_interval=100, min_scale=1.0, max_scale=64.0))
    core.set_scale(256.0)
    assert not DeviceSteps().allowed(core)
    core.set_scale(32.0)
    assert DeviceSteps().allowed(core)


@pytest.mark.parametrize("device_decisions", [False, True])
def test_a_floor_that_is_no_float32_value_still_raises(device_decisions):
    """min_scale=0.1 is stored as float32(0.1) > 0.1: the scale sitting there is at the floor on both paths."""
    model = torch_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # decided on the device when allowed
    scaler = GradScaler("cpu", init_scale=0.8, min_scale=0.1, device_decisions=device_decisions, model=model)
    with pytest.raises(ampsafe.LossScaleFloorError):
        for _ in range(8):
            opt.zero_grad()
            scaler.scale(model(torch.ones(2, 4)).sum()).backward()
            poison_torch_grad(model[2].weight)
            scaler.step(opt)
            scaler.update()
    assert scaler.get_scale() == float(np.float32(0.1)) and scaler.stats.floor_hits == 1
