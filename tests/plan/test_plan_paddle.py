"""``ampsafe plan --to paddle`` applied: ``paddle.amp.decorate(..., level="O2", excluded_layers=[...])`` and the
island line after it, on the Paddle model of :mod:`plan_models`, under the project's float16 emulation (Paddle has
no float16 CPU kernels; ``amp_emulation`` stores what O2 computes in float16 through float16).

The plan comes from a real ``ampsafe.scan(model, inputs, level="O2")`` of that model (the run's report for it,
``fixtures/paddle_o2_heal.json``, islanded ``head``, ``router`` and ``norm``: its plan is checked to name them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

paddle = pytest.importorskip("paddle")

import ampsafe  # noqa: E402
from ampsafe.paddle import amp_emulation  # noqa: E402
from ampsafe.plan import plan  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from plan_models import PADDLE_ROUTER, paddle_batch, paddle_net  # noqa: E402


@pytest.fixture
def emulated():
    amp_emulation.install()
    try:
        yield
    finally:
        amp_emulation.uninstall()


def _train(code: str | None, steps: int = 6):
    """Losses, the router's weight dtype, its last output and the loss scale after each of ``steps`` O2 steps with
    Paddle's GradScaler; ``code``: the plan's decorate and island lines (else a plain O2 decorate)."""
    model = paddle_net()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scope = {"model": model, "optimizer": optimizer, "paddle": paddle, "ampsafe": ampsafe}
    if code:
        exec(code, scope)
    else:
        scope["model"], scope["optimizer"] = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2")
    model, optimizer = scope["model"], scope["optimizer"]
    scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**16)
    seen, losses, scales = {}, [], []
    router = model.router
    router.register_forward_post_hook(lambda layer, args, out: seen.update(out=out))
    for step in range(steps):
        x, y = paddle_batch(step)
        with paddle.amp.auto_cast(level="O2"):
            out = model(x)
        loss = paddle.nn.functional.mse_loss(out.astype("float32"), y)
        losses.append(float(loss))
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(optimizer, scaled)
        optimizer.clear_grad()
        scales.append(float(scaler.state_dict()["scale"][0]))
    return losses, router.weight.dtype, seen["out"], scales


def _finite(values) -> bool:
    return all(v == v and abs(v) != float("inf") for v in values)


def _trains_with_the_router_in_float32(code: str) -> None:
    losses, dtype, out, scales = _train(code)
    assert dtype == paddle.float32 and out.dtype == paddle.float32 and bool(paddle.isfinite(out).all())
    assert _finite(losses), losses  # no forward overflow, where the run had one at every step
    # the router's huge weights overflow the float16 backward at first: Paddle's scaler backs off, then holds
    assert scales[-1] == scales[-2] == scales[-3], scales


def test_the_runs_paddle_plan_trains_its_healed_layers_in_float32_under_emulated_O2(emulated):
    result = plan(HERE / "fixtures" / "paddle_o2_heal.json", "paddle")
    assert result.value == ["head", "router", "norm"]
    assert "excluded_layers=[model.head, model.router, model.norm]" in result.code
    _trains_with_the_router_in_float32(result.code)


def test_paddle_plan_from_a_scan_keeps_the_router_float32_under_emulated_O2(emulated):
    x, _ = paddle_batch(0)
    result = plan(ampsafe.scan(paddle_net(), (x,), level="O2"), "paddle")
    assert result.value == [PADDLE_ROUTER]
    losses, _, _, _ = _train(None)
    assert not _finite(losses)  # O2 overflows at the router
    decorate_only = result.code.split("\nampsafe.patch")[0]
    _, dtype, out, _ = _train(decorate_only)
    assert dtype == paddle.float32  # excluded_layers keeps the weights float32 ...
    assert not bool(paddle.isfinite(out).all())  # ... and O2 still computes the router in float16 (the note)
    _trains_with_the_router_in_float32(result.code)
