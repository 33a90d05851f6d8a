"""ampsafe.paddle.GradScaler against Paddle's own GradScaler (forced on: Paddle's disables itself on CPU)."""

from __future__ import annotations

import math
import os

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scaler_helpers import forced_paddle_scaler, paddle_fp16_amp_state, paddle_model, poison_paddle_grad

import ampsafe
from ampsafe.paddle import GradScaler as _GradScaler

NEUTRAL = dict(min_loss_scaling=0.0, max_loss_scaling=math.inf)
X = np.random.default_rng(1).standard_normal((16, 4)).astype("float32")


def GradScaler(*args, **kwargs):
    """ampsafe's scaler as on a GPU (``emulated=True``: on a CPU it disables itself as Paddle's does), to be
    compared with Paddle's forced on under Paddle's float16 AMP state."""
    return _GradScaler(*args, emulated=True, **kwargs)


def _train(scaler, pattern, *, model=None, opt=None, clip=False, minimize=False, value=math.inf):
    model = model or paddle_model()
    opt = opt or paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=model.parameters())
    x = paddle.to_tensor(X)
    scales = []
    with paddle_fp16_amp_state():
        for bad in pattern:
            loss = model(x).pow(2).mean()
            scaled = scaler.scale(loss)
            scaled.backward()
            if bad:
                poison_paddle_grad(model[2].weight, value)
            if clip:
                scaler.unscale_(opt)
            if minimize:
                scaler.minimize(opt, scaled)
            else:
                scaler.step(opt)
                scaler.update()
            opt.clear_grad()
            scales.append(float(np.asarray(scaler.state_dict()["scale"]).reshape(-1)[0]))
    return scales, [p.numpy().copy() for p in model.parameters()]


def _same(a, b) -> bool:
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


@settings(max_examples=8, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=30),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from([(2.0, 0.5, 256.0), (1.7, 0.3, 300.1)]),  # odd ratios: Paddle multiplies in float32
)
def test_neutral_extras_reproduce_forced_on_paddle_scaler_step_for_step(pattern, incr_n, decr_n, ratios):
    incr, decr, init = ratios
    kw = dict(
        init_loss_scaling=init,
        incr_ratio=incr,
        decr_ratio=decr,
        incr_every_n_steps=incr_n,
        decr_every_n_nan_or_inf=decr_n,
    )
    assert _same(_train(forced_paddle_scaler(**kw), pattern), _train(GradScaler(**kw, **NEUTRAL), pattern))


@pytest.mark.parametrize("mode", ["adam_minimize", "adamw_clip_nan"])
def test_neutral_extras_match_paddle_with_adam_minimize_and_unscale(mode):
    pattern = [i % 4 == 1 for i in range(16)]
    kw = dict(incr_every_n_steps=3, decr_every_n_nan_or_inf=2)

    def run(scaler):
        model = paddle_model()
        cls = paddle.optimizer.Adam if mode == "adam_minimize" else paddle.optimizer.AdamW
        opt = cls(learning_rate=1e-2, parameters=model.parameters())
        if mode == "adam_minimize":
            return _train(scaler, pattern, model=model, opt=opt, minimize=True)
        return _train(scaler, pattern, model=model, opt=opt, clip=True, value=math.nan)

    assert _same(run(forced_paddle_scaler(**kw)), run(GradScaler(**kw, **NEUTRAL)))


def test_emulated_scales_on_cpu_where_paddles_own_disables_itself():
    assert not paddle.amp.GradScaler().is_enable()
    scaler = GradScaler(init_loss_scaling=8.0, on_floor="clamp")
    assert scaler.is_enable() and scaler.is_use_dynamic_loss_scaling()
    scales, params = _train(scaler, [True] * 6)
    assert scales == [4.0, 2.0, 1.0, 1.0, 1.0, 1.0] and scaler.stats.floor_hits == 3
    assert all(np.isfinite(p).all() for p in params)


def test_floor_raise_names_poisoned_parameter_and_scale_history():
    model = paddle_model()
    scaler = GradScaler(init_loss_scaling=2.0**6, decr_every_n_nan_or_inf=2)
    with pytest.raises(ampsafe.LossScaleFloorError, match="backward pass") as info:
        _train(scaler, [True] * 50, model=model)
    assert scaler.stats.total_steps == 2 * 6 + 1
    assert info.value.offenders == ["2.weight"] and info.value.modules == ["2"]
    assert list(info.value.scale_history)[-3:] == [2.0, 2.0, 1.0]


def test_fp32_guard_skips_nonfinite_steps_and_counts_them():
    scaler = GradScaler(fp32_guard=True)
    assert not scaler.is_enable() and scaler.get_loss_scaling() == 1.0
    model = paddle_model()
    before = [p.numpy().copy() for p in model.parameters()]
    scales, params = _train(scaler, [True, False, True], model=model)
    assert scales == [1.0, 1.0, 1.0] and scaler.stats.skipped_steps == 2 and scaler.stats.total_steps == 3
    assert not all(np.array_equal(a, b) for a, b in zip(before, params))
    assert all(np.isfinite(p).all() for p in params)


def test_misuse_raises_paddles_errors_and_disabled_is_passthrough():
    model = paddle_model()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler()
    scaler.scale(model(paddle.to_tensor(X)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    off = GradScaler(enable=False)
    loss = model(paddle.to_tensor(X)).sum()
    assert off.scale(loss) is loss and off.state_dict() == {} and off.get_loss_scaling() == 1.0


def test_state_dict_has_paddles_keys_and_loads_into_paddles_scaler(tmp_path):
    scaler = GradScaler(init_loss_scaling=64.0, incr_every_n_steps=2, decr_every_n_nan_or_inf=2)
    _train(scaler, [True, False, False, True])
    sd = scaler.state_dict()
    native = forced_paddle_scaler()
    assert set(native.state_dict()) <= set(sd)
    native.load_state_dict(sd)
    assert float(native._scale.numpy()[0]) == scaler.get_loss_scaling() and native._decr_count == 1
    ours = GradScaler()
    ours.load_state_dict(native.state_dict())  # Paddle's own (scale as an array of shape [1])
    assert ours.get_loss_scaling() == scaler.get_loss_scaling() and ours._decr_count == 1


def test_resume_through_paddle_save_reproduces_uninterrupted_run(tmp_path):
    pattern = list(np.random.default_rng(2).random(30) < 0.35)
    kw = dict(
        init_loss_scaling=2.0**8,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
        min_loss_scaling=4.0,
        on_floor="clamp",
    )
    full = _train(GradScaler(**kw), pattern)
    model = paddle_model()
    opt = paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9, parameters=model.parameters())
    first = GradScaler(**kw)
    head = _train(first, pattern[:13], model=model, opt=opt)[0]
    path = os.fspath(tmp_path / "ckpt.pdparams")
    paddle.save({"scaler": first.state_dict(), "opt": opt.state_dict(), "model": model.state_dict()}, path)
    ckpt = paddle.load(path)
    # Paddle keys optimizer state by global parameter names, so the model and optimizer objects are reused (their
    # state reloaded from the file); the scaler is a fresh object built only from the checkpoint.
    model.set_state_dict(ckpt["model"])
    opt.set_state_dict(ckpt["opt"])
    second = GradScaler()
    second.load_state_dict(ckpt["scaler"])
    tail = _train(second, pattern[13:], model=model, opt=opt)
    assert _same(full, (head + tail[0], tail[1]))
    assert second.stats.skipped_steps == sum(pattern[13:])  # the run's records are not in the saved state


@pytest.mark.parametrize("rate", [0.001, 0.1, 0.5, 1.0])
def test_injected_steps_never_corrupt_parameters(rate):
    """2,000 simulated steps per rate (random gradients, real Paddle model and optimizer); the core runs 10,000."""
    rng = np.random.default_rng(int(rate * 1000))
    model = paddle_model(width=4)
    params = list(model.parameters())
    opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=params)
    scaler = GradScaler(init_loss_scaling=2.0**16, incr_every_n_steps=50, decr_every_n_nan_or_inf=2, on_floor="clamp")
    x = paddle.to_tensor(X[:2])
    loss = model(x).sum()
    scaler.scale(loss).backward()  # creates the gradient tensors; below they are overwritten in place
    grads = [p._grad_ivar() for p in params]
    pool = [[paddle.to_tensor(rng.standard_normal(p.shape).astype("float32")) for p in params] for _ in range(16)]
    bad = []
    for p in params:
        for value in (math.nan, math.inf):
            arr = rng.standard_normal(p.shape).astype("float32")
            arr.reshape(-1)[0] = value
            bad.append(paddle.to_tensor(arr))
    steps = 2_000
    injected = rng.random(steps) < rate
    which = rng.integers(len(bad), size=steps)
    for i in range(steps):
        for grad, fresh in zip(grads, pool[i % len(pool)]):
            paddle.assign(fresh, output=grad)
        if injected[i]:
            paddle.assign(bad[which[i]], output=grads[which[i] // 2])
        scaler.step(opt)
        scaler.update()
        assert 1.0 <= scaler.get_loss_scaling() <= 2.0**24
    assert all(np.isfinite(p.numpy()).all() for p in params)
    assert scaler.stats.skipped_steps == int(injected.sum()) and scaler.stats.total_steps == steps


def test_overflow_and_state_dict_are_numpy_2_4_safe_where_paddles_own_is_not():
    """NumPy 2.4 turns 'float() of an array with ndim > 0' from a DeprecationWarning into an error; treating that
    warning as an error reproduces it on the installed NumPy."""
    import warnings

    outcomes = {}
    for name, scaler in (("paddle", forced_paddle_scaler()), ("ampsafe", GradScaler())):
        model = paddle_model()
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        with paddle_fp16_amp_state(), warnings.catch_warnings():
            scaler.scale(model(paddle.to_tensor(X)).sum()).backward()
            poison_paddle_grad(model[2].weight)
            warnings.filterwarnings("error", message=".*ndim > 0.*")
            try:
                scaler.step(opt)
                scaler.update()
                scaler.load_state_dict(scaler.state_dict())
                outcomes[name] = "ok"
            except DeprecationWarning:
                outcomes[name] = "numpy-2.4 error"
    assert outcomes == {"paddle": "numpy-2.4 error", "ampsafe": "ok"}


def test_fixed_scale_mode_matches_paddle_use_dynamic_loss_scaling_false():
    pattern = [False, True, False, False, True, True, False]
    kw = dict(init_loss_scaling=512.0, use_dynamic_loss_scaling=False)
    ours_scaler = GradScaler(**kw)
    theirs, ours = _train(forced_paddle_scaler(**kw), pattern), _train(ours_scaler, pattern)
    assert _same(theirs, ours) and set(ours[0]) == {512.0}
    assert not ours_scaler.is_use_dynamic_loss_scaling() and ours_scaler.stats.skipped_steps == 3


def test_heal_hook_gets_offenders_and_the_scale_restarts_before_the_collapse():
    calls = []
    scaler = GradScaler(init_loss_scaling=32.0, on_floor="heal")
    scaler.heal_hook = lambda s, info: calls.append(info) or list(info.modules)
    _train(scaler, [False] * 2 + [True] * 6 + [False])  # 32 -> 1 in 5 overflows, the 6th is at the floor
    assert len(calls) == 1 and calls[0].offenders == ("2.weight",) and calls[0].scale_before_collapse == 32.0
    assert scaler.stats.heals[0].paths == ("2",) and scaler.get_loss_scaling() == 32.0
    builtin = GradScaler(init_loss_scaling=2.0, on_floor="heal")  # the built-in heal: backward evidence
    scales, _ = _train(builtin, [True] * 4)
    assert [h.paths for h in builtin.stats.heals] == [("2",)] and builtin.stats.heals[0].verdict.where == "backward"
    assert scales == [1.0, 1.0, 0.5, 0.25] and [b.step for b in builtin.stats.below_floor] == [2, 3]
    with pytest.raises(ampsafe.LossScaleFloorError, match=r"after islanding 2 and after 24 backoffs below the floor"):
        _train(GradScaler(init_loss_scaling=2.0, on_floor="heal"), [True] * 40)


def test_step_callbacks_see_the_step_after_the_floor_dispatch_even_when_it_raises():
    seen = []
    scaler = GradScaler(init_loss_scaling=4.0, on_floor="heal")
    scaler.heal_hook = lambda s, info: list(info.modules)
    scaler.add_step_callback(
        lambda d: seen.append((d.step, d.floor_hit, len(scaler.stats.heals), scaler.get_loss_scaling()))
    )
    _train(scaler, [True] * 3)
    assert seen == [(0, False, 0, 2.0), (1, False, 0, 1.0), (2, True, 1, 4.0)]  # healed before the callback ran
    seen.clear()
    raising = GradScaler(init_loss_scaling=2.0, on_floor="raise", callback=lambda d: seen.append(d.floor_hit))
    with pytest.raises(ampsafe.LossScaleFloorError):
        _train(raising, [True] * 3)
    assert seen == [False, True]


def test_heal_hook_plan_sets_the_scale_to_restart_from():
    from ampsafe.core.scale import HealPlan

    scaler = GradScaler(init_loss_scaling=32.0, on_floor="heal")
    scaler.heal_hook = lambda s, info: HealPlan(tuple(info.modules), restore_scale=8.0)
    _train(scaler, [False] * 2 + [True] * 6)
    assert scaler.stats.heals[0].scale_after == 8.0 and scaler.get_loss_scaling() == 8.0
    empty = GradScaler(init_loss_scaling=2.0, on_floor="heal")
    empty.heal_hook = lambda s, info: HealPlan(())
    with pytest.raises(ampsafe.LossScaleFloorError, match="healed nothing"):
        _train(empty, [True] * 4)
