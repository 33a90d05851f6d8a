"""A plain training loop's ``AmpTensorBoard``: the ``amp/*`` series read back from its event file with the
``tensorboard`` package's reader equal the scaler's own figures at every step, for torch and for Paddle.

The loop starts at a scale that overflows float16 (2**40), so the first steps are skipped and backed off: the
series are not constant. The expected figures come from the scaler's own decisions (its step callback), not
from the integration."""

from __future__ import annotations

import pytest
from amp_logs import scalars

from ampsafe.integrations.tensorboard import AmpTensorBoard

STEPS = 8


def _expected(decisions) -> dict[int, dict[str, float]]:
    """step -> the figures after ``step`` optimizer steps, from the scaler's decisions."""
    out = {}
    for n in range(1, len(decisions) + 1):
        done = decisions[:n]
        out[n] = {
            "amp/loss_scale": float(done[-1].next_scale),
            "amp/skipped_steps": float(sum(d.skipped for d in done)),
            "amp/overflow_steps": float(sum(d.found_inf for d in done)),
            "amp/floor_hits": float(sum(d.floor_hit for d in done)),
            "amp/heals": 0.0,
        }
    return out


def _torch_loop(board_dir):
    torch = pytest.importorskip("torch")
    import ampsafe.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    decisions = []
    scaler = ampsafe.torch.GradScaler(
        "cpu", init_scale=2.0**40, max_scale=2.0**40, backoff_factor=2.0**-8, callback=decisions.append
    )
    with AmpTensorBoard(board_dir, scaler) as board:
        for step in range(STEPS):
            x = torch.randn(8, 16)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            board.log(step + 1)
    return scaler, decisions


def _paddle_loop(board_dir):
    paddle = pytest.importorskip("paddle")
    import ampsafe.paddle

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    decisions = []
    scaler = ampsafe.paddle.GradScaler(
        init_loss_scaling=2.0**40,
        max_loss_scaling=2.0**40,
        decr_ratio=2.0**-8,
        emulated=True,
        callback=decisions.append,
    )
    with AmpTensorBoard(board_dir, scaler) as board, ampsafe.paddle.emulate_fp16(model):
        for step in range(STEPS):
            loss = model(paddle.randn([8, 16])).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
            board.log(step + 1)
    return scaler, decisions


@pytest.mark.parametrize("loop", [_torch_loop, _paddle_loop], ids=["torch", "paddle"])
def test_plain_loop_event_file_holds_the_scaler_s_figures_at_every_step(loop, tmp_path):
    scaler, decisions = loop(tmp_path / "board")
    series = scalars(tmp_path / "board")
    expected = _expected(decisions)
    assert len(decisions) == STEPS and decisions[0].skipped and not decisions[-1].skipped  # backed off, then clean
    for name in expected[1]:
        assert series[name] == [(step, pytest.approx(figures[name])) for step, figures in expected.items()], name
    stats = scaler.stats
    final = {tag: values[-1][1] for tag, values in series.items()}
    assert final == {
        "amp/loss_scale": scaler.get_scale() if hasattr(scaler, "get_scale") else scaler.get_loss_scaling(),
        "amp/skipped_steps": stats.skipped_steps,
        "amp/overflow_steps": stats.overflow_steps,
        "amp/floor_hits": stats.floor_hits,
        "amp/heals": len(stats.heals),
    }
    assert stats.skipped_steps >= 1
