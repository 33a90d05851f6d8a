"""ampsafe.torch.GradScaler against the real torch.amp.GradScaler on small real models."""

from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scaler_helpers import poison_torch_grad, torch_model

import ampsafe
from ampsafe.errors import ConfigError
from ampsafe.torch import GradScaler

NEUTRAL = dict(min_scale=0.0, max_scale=math.inf, hysteresis=1)
X = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))


def _train(scaler, pattern, *, model=None, opt_factory=None, clip=False, value=float("inf")):
    model = model or torch_model()
    opt = (opt_factory or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)))(model.parameters())
    scales = []
    for bad in pattern:
        opt.zero_grad()
        loss = model(X).pow(2).mean()
        scaler.scale(loss).backward()
        if bad:
            poison_torch_grad(model[2].weight, value)
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=40),
    st.integers(1, 4),
    st.sampled_from([(2.0, 0.5, 256.0), (1.7, 0.3, 300.1)]),  # odd factors: torch rounds the float64 product
)
def test_neutral_extras_reproduce_torch_scales_and_parameters(pattern, interval, factors):
    growth, backoff, init = factors
    kw = dict(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    theirs = _train(torch.amp.GradScaler("cpu", **kw), pattern)
    ours = _train(GradScaler("cpu", **kw, **NEUTRAL), pattern)
    assert _same(theirs, ours)


@pytest.mark.parametrize("clip", [False, True])
def test_neutral_extras_match_torch_with_nan_grads_clipping_and_fused_adam(clip):
    pattern = [i % 4 == 1 for i in range(25)]
    fused = lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True)  # noqa: E731  (_step_supports_amp_scaling)
    for factory in (None, fused):
        theirs = _train(
            torch.amp.GradScaler("cpu", growth_interval=3), pattern, opt_factory=factory, clip=clip, value=math.nan
        )
        ours = _train(
            GradScaler("cpu", growth_interval=3, **NEUTRAL), pattern, opt_factory=factory, clip=clip, value=math.nan
        )
        assert _same(theirs, ours)


def test_torch_collapses_to_zero_where_the_floor_holds():
    theirs = _train(torch.amp.GradScaler("cpu"), [True] * 170)[0]
    ours = _train(GradScaler("cpu", on_floor="clamp"), [True] * 170)[0]
    assert theirs[-1] == 0.0 and min(ours) == 1.0 and ours[-1] == 1.0


def test_floor_raise_names_the_poisoned_parameter_and_backward_origin():
    scaler = GradScaler("cpu", init_scale=2.0**10, min_scale=1.0, hysteresis=2)
    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        _train(scaler, [True] * 100)
    err = info.value
    assert scaler.stats.total_steps <= 2 * 10 + 1
    assert err.offenders == ["2.weight"] and err.modules == ["2"]
    assert err.scale_independent is False and "backward pass" in str(err)
    assert list(err.scale_history)[-3:] == [2.0, 2.0, 1.0]  # h=2: two steps per scale, then the floor


def test_floor_raise_says_no_loss_scale_fixes_a_nonfinite_loss():
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=4.0, min_scale=1.0)
    with pytest.raises(ampsafe.LossScaleFloorError, match="no loss scale can fix this") as info:
        for _ in range(5):
            opt.zero_grad()
            loss = (model(X) * math.inf).mean()  # overflow in the forward pass
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert info.value.scale_independent is True


def test_clamp_keeps_skipping_at_the_floor_and_never_applies_nonfinite_update():
    scaler = GradScaler("cpu", init_scale=8.0, on_floor="clamp")
    before = [p.detach().clone() for p in torch_model().parameters()]
    scales, params = _train(scaler, [True] * 20)
    assert scales[-1] == 1.0 and scaler.stats.floor_hits == 20 - 3 and scaler.stats.skipped_steps == 20
    assert all(torch.equal(a, b) for a, b in zip(before, params))


def test_backward_only_floor_islands_the_module_then_goes_below_the_floor_and_raises_only_past_the_lowest_scale():
    """A non-finite gradient the forward does not show: the built-in heal islands the module that owns it, then
    backs off below the floor as torch's scaler would, and raises (saying what it tried) only past 2**-24."""
    scaler = GradScaler("cpu", init_scale=2.0, on_floor="heal")
    scales, _ = _train(scaler, [True] * 5)
    heal = scaler.stats.heals[0]
    assert heal.step == 1 and heal.paths == ("2",) and heal.verdict.where == "backward"
    assert scales == [1.0, 1.0, 0.5, 0.25, 0.125] and [b.step for b in scaler.stats.below_floor] == [2, 3, 4]
    assert scaler.stats.below_floor[0].module == "2" and "an FP32 island already" in scaler.stats.below_floor[0].reason
    with pytest.raises(ampsafe.LossScaleFloorError, match=r"after islanding 2 and after 24 backoffs below the floor"):
        _train(GradScaler("cpu", init_scale=2.0, on_floor="heal"), [True] * 40)


def test_heal_hook_is_called_with_the_offenders_and_the_scale_restarts_before_the_collapse():
    calls = []
    scaler = GradScaler("cpu", init_scale=64.0, on_floor="heal")
    scaler.heal_hook = lambda s, info: calls.append(info) or [info.modules[0]]
    _train(scaler, [False] * 3 + [True] * 8 + [False] * 2)
    assert len(calls) == 1 and calls[0].offenders == ("2.weight",) and calls[0].scale_before_collapse == 64.0
    heal = scaler.stats.heals[0]
    assert heal.paths == ("2",) and heal.scale_after == 64.0 and heal.step == 9


def test_fp32_guard_skips_nonfinite_steps_without_scaling():
    scaler = GradScaler("cpu", fp32_guard=True)
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0
    model = torch_model()
    loss = model(X).sum()
    assert scaler.scale(loss) is loss
    before = [p.detach().clone() for p in model.parameters()]
    scales, params = _train(scaler, [True, True, False], model=model)
    assert scales == [1.0, 1.0, 1.0] and scaler.stats.skipped_steps == 2 and scaler.stats.total_steps == 3
    assert not all(torch.equal(a, b) for a, b in zip(before, params))
    assert all(torch.isfinite(p).all() for p in params)


def test_disabled_scaler_is_a_passthrough_like_torch():
    scaler = GradScaler("cpu", enabled=False)
    theirs = _train(torch.amp.GradScaler("cpu", enabled=False), [False] * 3)
    assert _same(theirs, _train(scaler, [False] * 3)) and scaler.state_dict() == {}


def test_misuse_raises_torchs_errors():
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    with pytest.raises(AssertionError, match="did not use scaler.scale"):
        scaler.step(opt)
    scaler.scale(model(X).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: 0)
    scaler.update()
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.update()
    with pytest.raises(ConfigError, match="min_scale"):
        GradScaler("cpu", min_scale=-1.0)


def test_gradient_accumulation_and_two_optimizers_share_one_scaler_like_torch():
    def run(scaler):
        a, b = torch_model(0), torch_model(1)
        oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.Adam(b.parameters(), lr=0.01)
        out = []
        for step in range(12):
            for micro in range(2):
                loss = a(X).mean() + b(X).pow(2).mean()
                scaler.scale(loss / 2).backward()
                if step in (3, 4) and micro == 1:
                    poison_torch_grad(b[0].weight)
            scaler.step(oa)
            scaler.step(ob)
            scaler.update()
            oa.zero_grad()
            ob.zero_grad()
            out.append(scaler.get_scale())
        return out, [p.detach().clone() for p in [*a.parameters(), *b.parameters()]]

    assert _same(
        run(torch.amp.GradScaler("cpu", growth_interval=2)), run(GradScaler("cpu", growth_interval=2, **NEUTRAL))
    )


def test_update_new_scale_getters_setters_and_state_dict_keys():
    scaler = GradScaler("cpu", growth_interval=5, hysteresis=2)
    _train(scaler, [False])
    scaler.set_growth_factor(4.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(3)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (4.0, 0.25, 3)
    sd = scaler.state_dict()
    assert set(torch.amp.GradScaler("cpu").state_dict()) <= set(sd)
    assert {"min_scale", "max_scale", "hysteresis", "on_floor", "_overflow_tracker"} <= set(sd) and "stats" not in sd
    native = torch.amp.GradScaler("cpu")
    native.load_state_dict(sd)  # torch can read ours
    assert native.get_scale() == sd["scale"] and native.get_growth_factor() == 4.0
    with pytest.raises(ConfigError):
        scaler.set_backoff_factor(2.0)
    assert scaler.get_backoff_factor() == 0.25  # a refused change changes nothing


def test_update_with_new_scale_sets_the_scale():
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(X).sum()).backward()
    scaler.step(opt)
    scaler.update(new_scale=128.0)
    assert scaler.get_scale() == 128.0 and scaler._scale.item() == 128.0
    scaler.scale(model(X).sum()).backward()
    scaler.step(opt)
    scaler.update(new_scale=torch.tensor(32.0))
    assert scaler.get_scale() == 32.0


def test_resume_through_torch_save_reproduces_uninterrupted_run():
    rng = np.random.default_rng(5)
    pattern = list(rng.random(60) < 0.3)
    kwargs = dict(init_scale=2.0**8, growth_interval=3, hysteresis=2, min_scale=4.0, on_floor="clamp")
    full = _train(GradScaler("cpu", **kwargs), pattern)

    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = GradScaler("cpu", **kwargs)
    scales = _train(first, pattern[:27], model=model, opt_factory=lambda ps: opt)[0]
    buf = io.BytesIO()
    torch.save({"scaler": first.state_dict(), "opt": opt.state_dict(), "model": model.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    model2 = torch_model(seed=9)
    model2.load_state_dict(ckpt["model"])
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
    opt2.load_state_dict(ckpt["opt"])
    second = GradScaler("cpu")
    second.load_state_dict(ckpt["scaler"])
    rest = _train(second, pattern[27:], model=model2, opt_factory=lambda ps: opt2)
    assert _same(full, (scales + rest[0], rest[1]))
    assert second.stats.skipped_steps == sum(pattern[27:])  # the run's records are not in the saved state
    assert pickle.loads(pickle.dumps(second)).get_scale() == second.get_scale()


def test_step_callback_sees_each_step():
    records = []
    scaler = GradScaler("cpu", init_scale=16.0, growth_interval=2, callback=records.append)
    _train(scaler, [True, False, False])
    assert [(r.skipped, r.scale, r.next_scale) for r in records] == [
        (True, 16.0, 8.0),
        (False, 8.0, 8.0),
        (False, 8.0, 16.0),
    ]


def test_step_callbacks_see_the_step_after_the_floor_dispatch_even_when_it_raises():
    seen = []
    scaler = GradScaler("cpu", init_scale=4.0, on_floor="heal")
    scaler.heal_hook = lambda s, info: [info.modules[0]]
    scaler.add_step_callback(lambda d: seen.append((d.step, d.floor_hit, len(scaler.stats.heals), scaler.get_scale())))
    _train(scaler, [True] * 3)
    assert seen == [(0, False, 0, 2.0), (1, False, 0, 1.0), (2, True, 1, 4.0)]  # healed before the callback ran
    seen.clear()
    raising = GradScaler("cpu", init_scale=2.0, on_floor="raise", callback=lambda d: seen.append(d.floor_hit))
    with pytest.raises(ampsafe.LossScaleFloorError):
        _train(raising, [True] * 3)
    assert seen == [False, True]


@pytest.mark.parametrize("rate", [0.001, 0.1, 0.5, 1.0])
def test_ten_thousand_injected_steps_never_corrupt_parameters(rate):
    """Simulated steps: real model parameters and optimizer, gradients drawn at random (no forward pass)."""
    gen = torch.Generator().manual_seed(int(rate * 1000))
    model = torch_model(width=4)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    scaler = GradScaler("cpu", init_scale=2.0**16, growth_interval=50, min_scale=1.0, hysteresis=2, on_floor="clamp")
    one = torch.ones(())
    steps = 10_000
    injected = (torch.rand(steps, generator=gen) < rate).tolist()
    which = torch.randint(len(params), (steps,), generator=gen).tolist()
    kind = (torch.rand(steps, generator=gen) < 0.5).tolist()
    for p in params:
        p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    pool = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(16)]
    for i in range(steps):
        scaler.scale(one)
        torch._foreach_mul_(torch._foreach_copy_(grads, pool[i % len(pool)]), scaler._scale)
        if injected[i]:
            poison_torch_grad(params[which[i]], math.nan if kind[i] else -math.inf)
        scaler.step(opt)
        scaler.update()
        assert 1.0 <= scaler.get_scale() <= 2.0**24
    assert all(torch.isfinite(p).all() for p in params)
    assert scaler.stats.skipped_steps == sum(injected) and scaler.stats.total_steps == steps


def test_always_overflowing_raises_within_bound_naming_the_injected_parameter():
    model = torch_model(width=4)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    h, init, floor = 2, 2.0**12, 2.0
    scaler = GradScaler("cpu", init_scale=init, min_scale=floor, hysteresis=h)
    bound = h * int(math.log2(init / floor)) + 1
    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        for _ in range(bound + 5):
            scaler.scale(torch.ones(()))
            for p in params:
                p.grad = torch.ones_like(p)
            poison_torch_grad(params[3])
            scaler.step(opt)
            scaler.update()
    assert scaler.stats.total_steps <= bound
    assert info.value.offenders == ["2.bias"]


def _fused_run(scaler, pattern, reads=None):
    model = torch_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # _step_supports_amp_scaling
    for bad in pattern:
        opt.zero_grad()
        loss = model(X).pow(2).mean()
        scaler.scale(loss).backward()
        if bad:
            poison_torch_grad(model[2].weight)
        if reads is None:
            scaler.step(opt)
            scaler.update()
        else:
            with reads:
                scaler.step(opt)
                scaler.update()
    return model


class _CountHostReads:
    """Counts Tensor.item / tolist / __bool__ / __float__ / __int__ calls (host reads: syncs on a GPU)."""

    names = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self):
        self.count = 0
        self.originals = {n: getattr(torch.Tensor, n) for n in self.names}

    def __enter__(self):
        for name, fn in self.originals.items():
            setattr(torch.Tensor, name, self._counted(fn))
        return self

    def _counted(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)

        return counted

    def __exit__(self, *exc):
        for name, fn in self.originals.items():
            setattr(torch.Tensor, name, fn)


@pytest.mark.parametrize("on_floor, max_reads", [("clamp", 0), ("raise", 6)])
def test_fused_optimizer_steps_need_no_or_amortized_host_syncs_and_match_torch(on_floor, max_reads):
    """clamp: every step decided on the device (0 syncs, as torch); raise: a sync only once the unknown steps could
    have reached the floor (1024 * 0.3**6 < 1: one sync per 5 steps here; one per 16 at 2**16, backoff 0.5)."""
    pattern = [i % 5 == 2 for i in range(30)]
    kw = dict(init_scale=2.0**10, growth_factor=1.7, backoff_factor=0.3, growth_interval=3)
    native_reads, our_reads = _CountHostReads(), _CountHostReads()
    native = torch.amp.GradScaler("cpu", **kw)
    theirs = _fused_run(native, pattern, native_reads)
    ours_scaler = GradScaler("cpu", **kw, min_scale=1.0, on_floor=on_floor, device_decisions=True)
    ours = _fused_run(ours_scaler, pattern, our_reads)
    assert native_reads.count == 0 and our_reads.count <= max_reads
    assert all(torch.equal(a, b) for a, b in zip(theirs.parameters(), ours.parameters()))
    assert ours_scaler.get_scale() == native.get_scale()
    assert ours_scaler._get_growth_tracker() == native._get_growth_tracker()
    assert (ours_scaler.stats.total_steps, ours_scaler.stats.skipped_steps) == (30, sum(pattern))


def test_fused_optimizer_device_steps_agree_with_host_decisions_including_hysteresis():
    pattern = [True, True, False, True, True, True, False, False, False, False, True, False] * 3
    kw = dict(init_scale=2.0**12, growth_interval=4, min_scale=1.0, hysteresis=2, on_floor="clamp")
    host = GradScaler("cpu", **kw, callback=lambda d: None)  # a per-step callback forces host decisions
    device = GradScaler("cpu", **kw, device_decisions=True)
    a, b = _fused_run(host, pattern), _fused_run(device, pattern)
    assert device._lag == len(pattern)  # every step was decided on the device
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert device.state_dict()["_overflow_tracker"] == host.state_dict()["_overflow_tracker"]
    sa, sb = host.state_dict(), device.state_dict()
    for key in ("scale", "_growth_tracker", "_overflow_tracker", "_last_clean_scale"):
        assert sa[key] == sb[key], key
    assert (host.stats.skipped_steps, host.stats.floor_hits) == (device.stats.skipped_steps, device.stats.floor_hits)
    assert "stats" not in sa  # the run's records are not part of the saved scaling state


def test_fused_optimizer_still_raises_at_the_floor_naming_the_parameter():
    scaler = GradScaler("cpu", init_scale=2.0**6, min_scale=1.0, hysteresis=2, device_decisions=True)
    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        _fused_run(scaler, [True] * 40)
    assert scaler._core.stats.total_steps == 2 * 6 + 1 and info.value.offenders == ["2.weight"]
