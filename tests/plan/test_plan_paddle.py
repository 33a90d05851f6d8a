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


def _train(code: str | None, steps: int = 3):
    """Losses, the router's weight dtype and last output of ``steps`` O2 steps with Paddle's GradScaler; ``code``: the
    plan's decorate and island lines (else a plain O2 decorate)."""
    model = paddle_net()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scope = {"model": model, "optimizer": optimizer, "paddle": paddle, "ampsafe": ampsafe}
    if code:
        exec(code, scope)
    else:
        scope["model"], scope["optimizer"] = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2")
    model, optimizer = scope["model"], scope["optimizer"]
    scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**16)
    seen, losses = {}, []
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
    return losses, router.weight.dtype, seen["out"]


def test_the_runs_paddle_plan_names_the_layers_it_healed():
    result = plan(HERE / "fixtures" / "paddle_o2_heal.json", "paddle")
    assert result.value == ["head", "router", "norm"]
    assert "excluded_layers=[model.head, model.router, model.norm]" in result.code


def test_paddle_plan_from_a_scan_keeps_the_router_float32_under_emulated_O2(emulated):
    x, _ = paddle_batch(0)
    result = plan(ampsafe.scan(paddle_net(), (x,), level="O2"), "paddle")
    assert result.value == [PADDLE_ROUTER]
    losses, _, out = _train(None)
    assert not all(map(lambda v: v == v and abs(v) != float("inf"), losses))  # O2 overflows at the router
    decorate_only = result.code.split("\nampsafe.patch")[0]
    _, dtype, out = _train(decorate_only)
    assert dtype == paddle.float32  # excluded_layers keeps the weights float32 ...
    assert not bool(paddle.isfinite(out).all())  # ... and O2 still computes the router in float16 (the note)
    losses, dtype, out = _train(result.code)
    assert dtype == paddle.float32 and out.dtype == paddle.float32 and bool(paddle.isfinite(out).all())
    assert all(v == v and abs(v) != float("inf") for v in losses), losses
