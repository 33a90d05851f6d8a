"""The neutral loss-scale state machine: properties for any overflow sequence, and exact agreement with the
frameworks' own update rules (torch._amp_update_scale_, Paddle's GradScaler._update)."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scaler_helpers import forced_paddle_scaler, paddle_fp16_amp_state

from ampsafe.core.scale import LossScaleState, OnFloor, ScalePolicy
from ampsafe.errors import ConfigError

patterns = st.lists(st.booleans(), min_size=1, max_size=300)
policies = st.builds(
    dict,
    init_exp=st.integers(-2, 20),
    min_exp=st.integers(-4, 4),
    span=st.integers(0, 24),
    growth_interval=st.integers(1, 6),
    hysteresis=st.integers(1, 4),
    growth_factor=st.sampled_from([2.0, 1.5, 3.0, 1.0001]),
    backoff_factor=st.sampled_from([0.5, 0.25, 0.3, 0.9]),
    product=st.sampled_from(["float32", "float64"]),
)


def _policy(d) -> ScalePolicy:
    lo = 2.0 ** d["min_exp"]
    hi = lo * 2.0 ** d["span"]
    init = min(max(2.0 ** d["init_exp"], lo), hi)
    return ScalePolicy(
        init_scale=init,
        min_scale=lo,
        max_scale=hi,
        growth_interval=d["growth_interval"],
        hysteresis=d["hysteresis"],
        growth_factor=d["growth_factor"],
        backoff_factor=d["backoff_factor"],
        on_floor="clamp",
        product=d["product"],
    )


@settings(max_examples=150, deadline=None)
@given(policies, patterns)
def test_scale_stays_within_floor_and_cap_for_any_overflow_sequence(d, pattern):
    p = _policy(d)
    state = LossScaleState(p)
    for found in pattern:
        decision = state.update(found)
        assert p.min_scale <= decision.next_scale <= p.max_scale
        assert decision.skipped == found


@settings(max_examples=150, deadline=None)
@given(policies, patterns)
def test_growth_only_after_growth_interval_clean_steps(d, pattern):
    p = _policy(d)
    state = LossScaleState(p)
    clean_run = 0
    for found in pattern:
        decision = state.update(found)
        clean_run = 0 if found else clean_run + 1
        if decision.next_scale > decision.scale:
            assert decision.grew and not found
            assert clean_run >= p.growth_interval and clean_run % p.growth_interval == 0
        if not found and clean_run % p.growth_interval == 0 and decision.scale < p.max_scale:
            assert decision.next_scale > decision.scale  # and it does grow when due (below the cap)


@settings(max_examples=150, deadline=None)
@given(policies, patterns)
def test_backoff_only_after_hysteresis_overflows_in_a_row(d, pattern):
    p = _policy(d)
    state = LossScaleState(p)
    overflow_run = 0
    for found in pattern:
        decision = state.update(found)
        overflow_run = overflow_run + 1 if found else 0
        if decision.next_scale < decision.scale:
            assert found and overflow_run % p.hysteresis == 0
        if found and overflow_run % p.hysteresis == 0 and decision.scale > p.min_scale:
            assert decision.next_scale < decision.scale  # and it does back off when due (above the floor)
        assert decision.floor_hit == (found and decision.scale <= p.min_scale)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=80),
    st.floats(1.01, 8.0),
    st.floats(0.05, 0.95),
    st.integers(1, 5),
    st.floats(1e-3, 1e6),
)
def test_neutral_policy_matches_torch_amp_update_scale_bit_for_bit(pattern, growth, backoff, interval, init):
    torch = pytest.importorskip("torch")
    init = float(np.float32(init))
    scale = torch.full((), init, dtype=torch.float32)
    tracker = torch.zeros((), dtype=torch.int32)
    state = LossScaleState(
        ScalePolicy(init, growth, backoff, interval, min_scale=0.0, max_scale=math.inf, hysteresis=1, product="float64")
    )
    for found in pattern:
        torch._amp_update_scale_(scale, tracker, torch.tensor(float(found)), growth, backoff, interval)
        state.update(found)
        assert float(state.scale) == scale.item()
        assert state.growth_tracker == tracker.item()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=60),
    st.sampled_from([2.0, 1.7, 3.0]),
    st.sampled_from([0.5, 0.3, 0.77]),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_hysteresis_matches_paddle_decr_every_n_nan_or_inf(pattern, incr, decr, incr_n, decr_n):
    pytest.importorskip("paddle")
    theirs = forced_paddle_scaler(
        init_loss_scaling=1024.0,
        incr_ratio=incr,
        decr_ratio=decr,
        incr_every_n_steps=incr_n,
        decr_every_n_nan_or_inf=decr_n,
    )
    ours = LossScaleState(
        ScalePolicy(1024.0, incr, decr, incr_n, min_scale=0.0, max_scale=math.inf, hysteresis=decr_n, product="float32")
    )
    with paddle_fp16_amp_state():
        for found in pattern:
            theirs._cache_found_inf = found
            theirs._update()
            ours.update(found)
            assert float(ours.scale) == float(theirs._scale.numpy()[0])
            assert (ours.growth_tracker, ours.overflow_tracker) == (theirs._incr_count, theirs._decr_count)


@pytest.mark.parametrize("rate", [0.001, 0.1, 0.5, 1.0])
def test_ten_thousand_injected_steps_keep_scale_in_range_and_count_skips_exactly(rate):
    rng = np.random.default_rng(int(rate * 1000))
    p = ScalePolicy(
        init_scale=2.0**16, growth_interval=7, min_scale=1.0, max_scale=2.0**24, hysteresis=2, on_floor="clamp"
    )
    state = LossScaleState(p)
    injected = rng.random(10_000) < rate
    for found in injected:
        d = state.update(bool(found))
        assert p.min_scale <= d.next_scale <= p.max_scale
    assert state.stats.total_steps == 10_000
    assert state.stats.skipped_steps == state.stats.overflow_steps == int(injected.sum())
    if rate == 1.0:
        # floor reached after hysteresis*log2(init/min) steps, every later step is a floor hit
        assert state.stats.floor_hits == 10_000 - 2 * 16


def test_first_floor_hit_comes_within_hysteresis_times_log2_range_plus_one_steps():
    for h in (1, 2, 3):
        state = LossScaleState(ScalePolicy(init_scale=2.0**16, min_scale=1.0, hysteresis=h, on_floor="raise"))
        step = next(i for i in range(1000) if state.update(True).floor_hit)
        assert step + 1 == h * 16 + 1


def test_resume_from_json_state_dict_reproduces_uninterrupted_run():
    rng = np.random.default_rng(3)
    pattern = rng.random(400) < 0.2
    policy = dict(init_scale=512.0, growth_interval=5, min_scale=2.0, hysteresis=3, on_floor="clamp")
    full = LossScaleState(ScalePolicy(**policy))
    expected = [full.update(bool(f)) for f in pattern]
    first = LossScaleState(ScalePolicy(**policy))
    got = [first.update(bool(f)) for f in pattern[:173]]
    saved = json.loads(json.dumps(first.state_dict()))
    second = LossScaleState(ScalePolicy())
    second.load_state_dict(saved)
    got += [second.update(bool(f)) for f in pattern[173:]]
    same = [dataclasses.replace(d, step=0) for d in got] == [dataclasses.replace(d, step=0) for d in expected]
    assert same  # every scale decision; a resumed state numbers its steps from its own start
    # the run's records stay with the process that made them: the resumed state counts its own steps
    assert (second.stats.total_steps, second.stats.skipped_steps) == (400 - 173, int(pattern[173:].sum()))
    assert list(second.stats.scale_history) == list(full.stats.scale_history)[-len(second.stats.scale_history) :]


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(growth_factor=1.0), "growth_factor"),
        (dict(backoff_factor=1.0), "backoff_factor"),
        (dict(hysteresis=0), "hysteresis"),
        (dict(min_scale=4.0, max_scale=2.0, init_scale=3.0), "min_scale"),
        (dict(init_scale=0.0), "initial scale"),
        (dict(init_scale=float("inf")), "initial scale"),
        (dict(on_floor="ignore"), "on_floor"),
        (dict(growth_interval=0), "growth_interval"),
    ],
)
def test_invalid_policy_raises_config_error_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        ScalePolicy(**bad)


def test_update_decides_every_step_in_order():
    state = LossScaleState(ScalePolicy(init_scale=8.0, growth_interval=2, on_floor="clamp"))
    seen = [state.update(f) for f in (True, False, False, True)]
    assert [d.step for d in seen] == [0, 1, 2, 3]
    assert [d.next_scale for d in seen] == [4.0, 4.0, 8.0, 4.0]
    assert all(d.on_floor is OnFloor.CLAMP for d in seen)


@pytest.mark.parametrize("spelled", ["heal", OnFloor.HEAL])
def test_on_floor_is_an_enum_that_users_spell_as_a_string_and_state_dicts_store_as_one(spelled):
    state = LossScaleState(ScalePolicy(on_floor=spelled))
    assert state.policy.on_floor is OnFloor.HEAL and state.policy.on_floor == "heal"
    saved = state.state_dict()
    assert type(saved["on_floor"]) is str and json.loads(json.dumps(saved)) == saved
    other = LossScaleState(ScalePolicy())
    other.load_state_dict({**saved, "on_floor": spelled})
    assert other.policy.on_floor is OnFloor.HEAL
    with pytest.raises(ConfigError, match="on_floor must be one of raise, clamp, heal, got 'ignore'"):
        OnFloor.parse("ignore")
    state.policy.on_floor = "heal"  # a state pickled while on_floor was a plain string
    assert pickle.loads(pickle.dumps(state)).policy.on_floor is OnFloor.HEAL


@pytest.mark.parametrize("init, expected, bound", [(2.0**30, 2.0**24, "max_scale"), (0.25, 1.0, "min_scale")])
def test_initial_scale_outside_the_bounds_is_clamped_with_one_warning_naming_the_bound(init, expected, bound):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = LossScaleState(ScalePolicy(init_scale=init))
    assert float(state.scale) == expected
    assert len(caught) == 1 and f"pass {bound}={init!r}" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the line that built it, not into ampsafe


def test_contradictory_bounds_still_raise_even_with_a_clampable_initial_scale():
    with pytest.raises(ConfigError, match="min_scale"):
        ScalePolicy(init_scale=2.0**30, min_scale=8.0, max_scale=4.0)


def test_a_neutral_policy_growing_past_float32_keeps_its_scale_without_numpy_warnings():
    state = LossScaleState(
        ScalePolicy(init_scale=1e38, growth_factor=16.0, growth_interval=1, min_scale=0.0, max_scale=float("inf"))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decision = state.update(False)
    assert float(state.scale) == float(np.float32(1e38)) and not decision.grew and state.growth_tracker == 0
