"""The backward's evidence (:mod:`ampsafe.core.grad_origin`): which module's gradient first went non-finite.

The model: a small ``a`` Linear, then ``big`` (weights 1e4: its forward stays near 64 on inputs near 1e-4, but the
gradient it passes back to its input is 64 x 1e4 per unit of incoming gradient, past 65504 at scale 1), then a
``head``. ``big``'s own parameter gradients stay finite, ``a``'s go non-finite only because the infinite gradient
reaches them: the origin is ``big``'s activation gradient, which the parameter gradients alone cannot name.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(16, 64))
    model.add_module("big", torch.nn.Linear(64, 64))
    model.add_module("head", torch.nn.Linear(64, 1))
    with torch.no_grad():
        model.a.weight.mul_(1e-3)
        model.a.bias.zero_()
        model.big.weight.fill_(1e4)
        model.big.bias.zero_()
        model.head.weight.fill_(1.0)
    return model


def test_an_armed_step_names_the_module_whose_input_gradient_overflowed_not_the_parameters_it_reached():
    from ampsafe.torch import GradScaler

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = GradScaler("cpu", init_scale=2.0, on_floor="heal")
    seen = []
    scaler.add_step_callback(lambda d: seen.append(d.grad_origin))
    x = torch.full((4, 16), 0.1)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        assert float(out.detach().abs().max()) < 0.01 * 65504  # the forward is far from float16's max
        optimizer.zero_grad()
        scaler.scale(out.float().sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    first, armed = seen[0], seen[1]
    assert first.kind == "parameter" and first.module == "a"  # unarmed: only the parameters' gradients
    assert armed.kind == "activation" and armed.module == "big"  # armed after the overflow: the backward's hooks
    assert scaler.stats.heals[0].step == 1 and scaler.stats.heals[0].paths == ("big",)


def test_a_clean_step_disarms_the_trace_so_healthy_steps_carry_no_hooks():
    from ampsafe.torch import GradScaler

    model = _model()
    with torch.no_grad():
        model.big.weight.fill_(1e-2)  # in range: clean steps
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = GradScaler("cpu", init_scale=2.0**24, on_floor="heal")  # backs off until the backward fits
    x = torch.full((4, 16), 0.1)
    overflowed, armed = [], []
    for _ in range(30):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        optimizer.zero_grad()
        scaler.scale(out.float().sum()).backward()
        scaler.step(optimizer)
        before = scaler.stats.overflow_steps
        scaler.update()
        overflowed.append(scaler.stats.overflow_steps > before)
        armed.append(scaler._trace.armed)
    assert any(overflowed) and not all(overflowed)
    assert armed == overflowed  # armed after each overflowing step, disarmed by each clean one
