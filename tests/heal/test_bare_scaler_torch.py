"""A bare ampsafe.torch.GradScaler (no ampsafe.heal call, no model=) resolves its model, keeps the inputs of its
latest forward, and at the floor replays them: it heals (on_floor="heal") or raises with the measured pass."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from bare_models import HOT, torch_nets

import ampsafe
from ampsafe.patching import patched_modules
from ampsafe.torch import GradScaler


def _batch(step: int, hot_from: int = 2, n: int = 8):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(n, 16, generator=g) * (HOT if step >= hot_from else 1.0)
    return x, torch.zeros(n, 1)


def _step(model, opt, scaler, x, y, loss_of=None):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y) if loss_of is None else loss_of(x)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss


def _setup(**options):
    model = torch_nets()
    opt = torch.optim.SGD(model.net.parameters(), lr=1e-12)  # the optimizer holds the net, not the wrapper
    return model, opt, GradScaler("cpu", init_scale=4.0, **options)


def test_bare_heal_scaler_islands_the_forward_overflow_and_goes_on(caplog):
    model, opt, scaler = _setup(on_floor="heal")
    with caplog.at_level(logging.WARNING, logger="ampsafe.heal"):
        losses = [_step(model, opt, scaler, *_batch(step)) for step in range(8)]
    assert scaler.model is model.net  # the smallest module covering the optimizer, not the wrapper
    (heal,) = scaler.stats.heals
    assert heal.step == 4 and "big" in heal.paths and heal.scale_after == 4.0  # 4 -> 2 -> 1 at steps 2-3, floor at 4
    assert patched_modules(model)["net.big"] == "island"
    assert all(math.isfinite(float(loss)) for loss in losses[5:]) and scaler.get_scale() == 4.0
    line = next(r.getMessage() for r in caplog.records if "ampsafe heal at step" in r.getMessage())
    assert "step 4" in line and "big" in line and "scale restored to 4.0" in line
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_bare_raise_scaler_says_forward_and_names_the_linear_and_its_op():
    model, opt, scaler = _setup()  # on_floor="raise", the library default
    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        for step in range(6):
            _step(model, opt, scaler, *_batch(step))
    msg = str(info.value)
    assert info.value.info.where == "forward"
    assert "the forward pass: the first non-finite value comes from big:linear" in msg
    assert "in float32 its output reaches |x| = " in msg and "float16's max is 65504" in msg
    assert "the loss was finite" not in msg.lower() and "so the overflow is in the backward" not in msg
    assert "on_floor='heal' to island it" in msg  # the advice fits: heal is not set


def test_backward_only_overflow_names_the_parameters_from_the_loss_backwards():
    model, opt, scaler = _setup()

    def loss_of(x):  # finite forward; d(loss)/d(out) = 1e5 overflows float16 in the backward
        return model.net(x).float().sum() * 1e5

    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        for step in range(6):
            _step(model, opt, scaler, *_batch(step, hot_from=99), loss_of=loss_of)
    msg = str(info.value)
    assert info.value.info.where == "backward"
    assert "the backward pass: the model's forward pass replayed finite" in msg
    named = msg.split("(from the loss backwards): ")[1]
    assert named.startswith("net.head.")  # the layer next to the loss first (names as the root model spells them)
    assert "big.weight" in named and "fc1.weight" in named


def test_nonfinite_input_is_data_not_a_floor_and_is_not_healed():
    # a NaN in every batch: from step 1 (the model is resolved at step 0's step()) each is a data step, the scale
    # stays where step 0 left it, and the floor is never reached (the rule: ampsafe.core.scale's docstring)
    model, opt, scaler = _setup(on_floor="heal")
    decisions = []
    scaler.add_step_callback(decisions.append)
    for step in range(6):
        x, y = _batch(step, hot_from=99)
        x[5, 3] = math.nan
        _step(model, opt, scaler, x, y)
    assert [d.bad_input.sample for d in decisions[1:]] == [5] * 5
    assert scaler.stats.input_steps == 5 and scaler.stats.floor_hits == 0 and scaler.get_scale() == 2.0
    assert not scaler.stats.heals and not patched_modules(model)


def test_the_captured_inputs_are_the_callers_tensors_and_are_dropped_after_update():
    model, opt, scaler = _setup()
    _step(model, opt, scaler, *_batch(0))  # the first step resolves the model
    x, y = _batch(1)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y)
    args, kwargs = scaler.capture.latest
    assert args[0] is x and kwargs == {}  # a reference, not a copy
    scaler.scale(loss).backward()
    scaler.step(opt)
    assert scaler.capture.latest is not None
    scaler.update()
    assert scaler.capture.latest is None


def test_model_override_and_the_wrapper_when_it_is_what_the_optimizer_holds():
    model = torch_nets()
    scaler = GradScaler("cpu", init_scale=4.0, model=model)  # explicit: kept as given
    _step(model, torch.optim.SGD(model.net.parameters(), lr=1e-12), scaler, *_batch(0))
    assert scaler.model is model
    head_only = GradScaler("cpu", init_scale=4.0)
    _step(model, torch.optim.SGD(model.net.head.parameters(), lr=1e-12), head_only, *_batch(0))
    assert head_only.model is model.net.head


def test_replay_is_impossible_without_a_forward_of_the_resolved_model_and_says_so():
    model, opt, scaler = _setup()

    def loss_of(x):  # a custom loop: it calls the net's layers, never the net itself
        net = model.net
        return net.head(torch.relu(net.big(net.fc1(x)))).float().sum() * math.inf

    with pytest.raises(ampsafe.LossScaleFloorError) as info:
        for step in range(6):
            _step(model, opt, scaler, *_batch(step, hot_from=99), loss_of=loss_of)
    msg = str(info.value)
    assert info.value.info.where == "not replayed"
    assert "no inputs of the resolved model (Net) were captured" in msg and "forward pass" not in msg


def test_replay_leaves_buffers_as_they_were_and_no_nonfinite_update_is_applied():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1))
    with torch.no_grad():
        model[0].weight.mul_(1e4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = GradScaler("cpu", init_scale=2.0)
    before = None
    with pytest.raises(ampsafe.LossScaleFloorError, match="forward pass"):
        for step in range(4):
            x, _ = _batch(step, hot_from=1)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            before = [t.clone() for t in (*model.parameters(), *model.buffers())]
            scaler.update()  # the floor's replay runs in here
            opt.zero_grad()
    after = [*model.parameters(), *model.buffers()]
    same = lambda a, b: torch.equal(a.double().nan_to_num(7.0), b.double().nan_to_num(7.0))  # noqa: E731
    assert all(same(a, b) for a, b in zip(before, after, strict=True))  # NaN statistics stay NaN, nothing new


def test_patience_heals_a_forward_overflow_before_the_floor():
    model = torch_nets()
    opt = torch.optim.SGD(model.net.parameters(), lr=1e-12)
    scaler = GradScaler("cpu", init_scale=64.0, on_floor="heal", patience=2)
    for step in range(5):
        _step(model, opt, scaler, *_batch(step))
    (heal,) = scaler.stats.heals
    assert (
        heal.step == 3 and "big" in heal.paths and heal.scale_after == 64.0
    )  # overflows at steps 2 and 3: healed at 3, above the floor
    with pytest.raises(ampsafe.ConfigError, match="needs on_floor='heal'"):
        GradScaler("cpu", patience=2)
