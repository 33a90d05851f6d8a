"""When a bare torch GradScaler(on_floor="heal") heals (``ampsafe.healing.trigger``): a forward overflow that the
next ops swallow is named by ``watch`` and healed within 3 steps, islanding only the conv's path; a script that
restores the scale from a checkpoint every few steps still heals, at the step a monotone decay would floor; a
forward overflow that reaches the loss waits for the floor as before.

The swallowed overflow is the frozen-BatchNorm case of PP-OCRv4 fine-tuning: a conv's float16 output passes
65504 on a few lanes, a BatchNorm in eval mode with a negative weight and large trained variance turns the
``inf`` into ``-inf``, a ReLU zeroes it, the loss stays finite, and only the BatchNorm's weight gradient
(0 x inf) is non-finite. Built here with set weights on random inputs, trained under CPU autocast float16.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import ampsafe
from ampsafe.errors import NonFiniteError
from ampsafe.healing.trigger import floor_distance

FLOOR_STEP = 16  # 65536 -> 1 in 16 halvings: the 17th overflow in a row is the floor hit


def _net(frozen_bn: bool = True) -> nn.Module:
    """stem (conv -> BatchNorm -> ReLU) -> body (conv -> BatchNorm -> ReLU) -> pool -> fc; ``stem.conv`` passes
    65504 in float16 on positive inputs. ``frozen_bn``: the stem's BatchNorm in eval mode turns that inf into
    -inf, which the ReLU drops; else the whole network trains in train mode and the inf reaches the loss."""
    torch.manual_seed(0)
    stem = nn.Sequential(
        OrderedDict(conv=nn.Conv2d(3, 8, 3, padding=1, bias=False), bn=nn.BatchNorm2d(8), relu=nn.ReLU())
    )
    body = nn.Sequential(OrderedDict(conv=nn.Conv2d(8, 4, 3, padding=1), bn=nn.BatchNorm2d(4), relu=nn.ReLU()))
    net = nn.Sequential(
        OrderedDict(stem=stem, body=body, pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(4, 2))
    )
    with torch.no_grad():
        stem.conv.weight.uniform_(0.5, 1.0).mul_(5e3)  # |output| up to ~7e4 on inputs in [0, 1)
        stem.bn.weight.fill_(-1.0)
        stem.bn.running_var.fill_(1e10)  # trained statistics that bring 7e4 back to about 1
    if frozen_bn:
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()
    return net


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(4, 3, 16, 16, generator=g), torch.randn(4, 2, generator=g)


def _train(net, steps: int, scaler, reload_every: int = 0) -> list[int]:
    """The usual AMP loop; ``reload_every``: load the scaler's state saved after step 3 every that many steps
    (a trainer's recovery from its checkpoint). Returns the steps whose gradients were non-finite."""
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = _batch()
    saved, overflowed = None, []
    for step in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x)
        scaler.scale(nn.functional.mse_loss(out.float(), y)).backward()
        if not all(bool(torch.isfinite(p.grad).all()) for p in net.parameters() if p.grad is not None):
            overflowed.append(step)
        scaler.step(optimizer)
        scaler.update()
        if step == 3:
            saved = scaler.state_dict()
        if reload_every and step > 3 and step % reload_every == 3:
            scaler.load_state_dict(saved)
    return overflowed


def test_floor_distance_counts_the_halvings_and_the_floor_hit():
    policy = ampsafe.torch.GradScaler("cpu").policy
    assert floor_distance(policy, 0.0) == FLOOR_STEP + 1
    assert floor_distance(policy, 2.0**20) == 21  # from the highest scale the run used, if above the initial one
    scaler = ampsafe.torch.GradScaler("cpu", min_scale=8192.0, hysteresis=2)
    assert floor_distance(scaler.policy, 0.0) == 3 * 2 + 1
    assert floor_distance(ampsafe.torch.GradScaler("cpu", min_scale=0.0).policy, 0.0) is None  # no floor


def test_watch_names_the_conv_whose_overflow_the_frozen_bn_and_relu_swallow():
    net = _net()
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.float16):
        out = net(x)
    loss = nn.functional.mse_loss(out.float(), y)
    assert bool(torch.isfinite(loss)), "the loss must stay finite for this case"
    loss.backward()
    bad = [n for n, p in net.named_parameters() if not bool(torch.isfinite(p.grad).all())]
    assert bad == ["stem.bn.weight"], bad  # only the BatchNorm's weight gradient shows it
    net.zero_grad()
    with pytest.raises(NonFiniteError) as caught:
        with ampsafe.watch(net):
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(x)
            nn.functional.mse_loss(out.float(), y).backward()
    err = caught.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "stem.conv", "conv2d", "overflow"), err


def test_the_fp32_guards_replay_names_the_swallowed_conv_too():
    net = _net()
    x, y = _batch()

    def loss():
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x)
        return nn.functional.mse_loss(out.float(), y)

    with ampsafe.watch(net, guard=True, on_nonfinite="record") as guard:
        step_loss = loss()
        step_loss.backward()
        assert guard.check(step_loss, replay=loss) is False  # the step is skipped
    (err,) = guard.events
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "stem.conv", "conv2d", "overflow"), err


def test_a_swallowed_forward_overflow_heals_within_3_steps_islanding_only_the_convs_path():
    net = _net()
    scaler = ampsafe.torch.GradScaler("cpu", on_floor="heal")
    overflowed = _train(net, 8, scaler)
    assert overflowed and overflowed[0] == 0, overflowed
    (heal,) = scaler.stats.heals
    assert heal.step - overflowed[0] <= 3, (heal.step, overflowed)
    assert scaler.stats.floor_hits == 0
    # within the conv's path as ampsafe.scan gives it (the conv and the BatchNorm that normalizes it): the conv
    report = ampsafe.scan(_net(), (_batch()[0],), target="cpu")
    (path,) = [p for p in report.paths if p.risky]
    assert path.start == "stem.conv"
    assert "stem.conv" in heal.paths and set(heal.paths) <= set(path.layers), (heal.paths, path.layers)
    assert heal.paths == ("stem.conv",), heal.paths  # the path peaks in the conv the rule saw swallowed
    assert max(overflowed) == heal.step  # trains without an overflow after the heal
    assert type(net.stem.conv).__name__.startswith("FP32Island")


def test_an_overflow_that_reaches_the_loss_is_not_healed_early():
    # train-mode BatchNorm spreads the conv's inf over the batch: the loss is non-finite, the scale may be the
    # cause as far as the early rule knows, so only the floor (or patience) heals it
    net = _net(frozen_bn=False)
    scaler = ampsafe.torch.GradScaler("cpu", on_floor="heal")
    overflowed = _train(net, 4, scaler)
    assert overflowed == [0, 1, 2, 3]
    assert scaler.stats.heals == []


def test_a_scale_restored_every_4_steps_heals_where_a_monotone_decay_would_floor():
    # without the reloads the floor is hit at step 16; with the scale put back to the checkpoint's every 4 steps
    # the floor never comes, and the 17th overflowing step in a row heals as the floor would have
    decayed = ampsafe.torch.GradScaler("cpu", on_floor="heal")
    _train(_net(frozen_bn=False), FLOOR_STEP + 2, decayed)
    assert [h.step for h in decayed.stats.heals] == [FLOOR_STEP] and decayed.stats.floor_hits == 1

    reloaded = ampsafe.torch.GradScaler("cpu", on_floor="heal")
    overflowed = _train(_net(frozen_bn=False), FLOOR_STEP + 4, reloaded, reload_every=4)
    assert overflowed[: FLOOR_STEP + 1] == list(range(FLOOR_STEP + 1))
    assert min(reloaded.stats.scale_history) > 1.0  # the scale never reached its floor
    assert reloaded.stats.floor_hits == 0
    (heal,) = reloaded.stats.heals
    assert heal.step == FLOOR_STEP and "stem.conv" in heal.paths, heal
