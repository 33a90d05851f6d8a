"""ampsafe.heal on torch under real CPU float16 autocast (GrowNet: an unnormalized conv chain that grows)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from heal_counts import heal_costs

import ampsafe
from ampsafe.errors import ConfigError, LossScaleFloorError
from ampsafe_lab.workloads.heal_runs import train_grow

SMALL = {"init_scale": 4.0}  # floor (1.0) two backoffs after the first overflow


@pytest.fixture(scope="module")
def healed_run():
    return train_grow("heal", steps=16, patience=2)  # first overflow at step 5, healed at step 6


def test_grownet_heal_islands_neck_and_head_conv1_and_nothing_in_backbone(healed_run):
    heals = healed_run["scaler"].stats.heals
    assert len(heals) == 1
    found = set(healed_run["healer"].heals[0].found)
    assert {"head.conv1"} <= found <= {"head.conv1", *(f"neck.conv{i}" for i in range(4))}
    assert not any(p.startswith("backbone") for p in heals[0].paths)
    patched = ampsafe.patching.patched_modules(healed_run["model"])
    assert "head.conv1" in patched and set(patched.values()) == {"island"}


def test_grownet_recovers_after_heal_scale_restored_and_loss_falls(healed_run):
    step = healed_run["scaler"].stats.heals[0].step
    after = slice(step + 1, None)
    assert not any(healed_run["overflowed"][after])
    assert healed_run["scales"][step + 1] == healed_run["scales"][0] == 1024.0
    losses = healed_run["losses"][after]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_heal_is_logged_with_amax_and_restored_scale(caplog):
    with caplog.at_level(logging.WARNING, logger="ampsafe.heal"):
        run = train_grow("heal", steps=5, recipe=SMALL, batch_hook=_hot_from(0))
    record = run["scaler"].stats.heals[0]
    assert record.step == 2 and "backbone.0" in record.paths and record.scale_after == 4.0
    # the two overflowing forwards put inf into backbone.1's running statistics: the heal reset them
    assert "backbone.1" in record.reset_running_stats and record.amax, record
    # the heal's warning says all of it to the user (its content, wherever it lands among the records)
    text = caplog.text
    assert "ampsafe heal at step 2" in text and "max amax" in text and "scale restored to 4.0" in text
    assert "reset non-finite running statistics of backbone.1" in text
    bn = run["model"].backbone[1]
    assert torch.isfinite(bn.running_mean).all() and torch.isfinite(bn.running_var).all()


def _hot_from(first, until=None):
    def hook(step, x, model):
        return x * 1e5 if step >= first and (until is None or step < until) else x

    return hook


def test_nonfinite_input_is_data_not_healed_and_never_a_floor():
    def poison(step, x, model):
        x = x.clone()
        x[5, 1, 2, 3] = math.nan
        return x

    # from step 1 (the scaler resolves its model at step 0's step()) each NaN batch is a data step: scale kept
    run = train_grow("heal", steps=6, recipe=SMALL, batch_hook=poison)
    stats = run["scaler"].stats
    assert stats.input_steps == 5 and stats.floor_hits == 0 and not stats.heals and not run["healer"].heals
    assert len(set(run["scales"][1:])) == 1


class SqrtHead(torch.nn.Module):
    """conv -> sqrt(conv - 1000): NaN in float32 too, a numerical error no FP32 island can fix."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.sqrt(self.conv(x) - 1000.0)


def test_float32_numerical_failure_is_not_healed_and_says_so():
    torch.manual_seed(0)
    model = SqrtHead()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampsafe.torch.GradScaler("cpu", init_scale=2.0, min_scale=1.0, on_floor="heal")
    ampsafe.heal(model, scaler=scaler, target="cpu")
    with pytest.raises(LossScaleFloorError, match="non-finite in float32 too"):
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(2, 3, 8, 8)).float().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert ampsafe.patching.patched_modules(model) == {}


def test_gives_up_after_max_heals():
    def two_overflows(step, x, model):
        if step == 3:  # after the first heal (step 2): a second, different path leaves float16's range
            with torch.no_grad():
                model.head["conv1"].weight.mul_(1e4)
        return x * 1e5 if step < 3 else x

    with pytest.raises(LossScaleFloorError, match=r"gave up after 1 heals \(max_heals=1\)"):
        train_grow("heal", steps=8, recipe=SMALL, batch_hook=two_overflows, max_heals=1)


def test_heal_now_on_a_batch_returns_the_islanded_modules():
    from ampsafe_lab.workloads.heal_runs import grow_net

    model = grow_net(0, channels=8, neck_convs=2)
    x = torch.randn(2, 3, 16, 16) * 1e5
    patched = ampsafe.heal(model, lambda: (x,), target="cpu")
    assert "backbone.0" in patched and ampsafe.patching.protection_of(model.backbone[0]) == "island"


def test_heal_rejects_bad_arguments_and_changes_nothing():
    from ampsafe_lab.workloads.heal_runs import grow_net

    model = grow_net(0, channels=8, neck_convs=2)
    with pytest.raises(ConfigError, match="needs a scaler"):
        ampsafe.heal(model)
    with pytest.raises(ConfigError, match="on_floor='heal'"):
        ampsafe.heal(model, scaler=ampsafe.torch.GradScaler("cpu", on_floor="raise"))
    with pytest.raises(ConfigError, match="max_heals"):
        ampsafe.heal(model, scaler=ampsafe.torch.GradScaler("cpu", on_floor="heal"), max_heals=-1)
    with pytest.raises(ConfigError, match="patience"):
        ampsafe.heal(model, scaler=ampsafe.torch.GradScaler("cpu", on_floor="heal"), patience=0)
    assert not model._forward_pre_hooks
    assert ampsafe.patching.patched_modules(model) == {}


def test_patience_leaves_a_backward_only_overflow_to_the_scaler():
    """A scale too large for the gradients overflows every step while the forward is in range: with patience the
    healer checks once, finds nothing to island, and the scaler backs off as loss scaling should (no raise)."""
    with heal_costs() as costs:
        run = train_grow("heal", steps=12, patience=2, recipe={"init_scale": 2.0**24, "lr": 1e-4})
    overflowed = run["overflowed"]
    assert overflowed[:2] == [True, True] and not overflowed[-1], overflowed
    assert not run["scaler"].stats.heals and run["scales"][-1] < 2.0**24
    # one patience check ran the model (its scan found the forward in range), and it healed nothing
    assert [(c.method, c.healed) for c in costs.calls] == [("_heal_after_streak", False)], costs.calls
