"""ampsafe.paddle.GradScaler in Paddle's static graphs (PIR programs): the issue's snippet trains as Paddle's
scaler does, the floor and cap hold in the program, and what needs eager execution says so once."""

from __future__ import annotations

import warnings

import numpy as np
import paddle
import pytest

import ampsafe.paddle
from ampsafe.paddle import scaler as scaler_module


def _train(make_scaler, fill: float, steps: int = 3):
    """The issue's snippet (conv2d kept float32, so it runs on a CPU), trained ``steps`` steps on a constant
    batch; returns the losses and the scale after each step, read from the program's persistable scale."""
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            paddle.seed(0)
            m = paddle.nn.Conv2D(3, 2, 3)
            opt = paddle.optimizer.SGD(0.01, parameters=m.parameters())
            m, opt = paddle.amp.decorate(models=m, optimizers=opt)
            x = paddle.static.data("x", [1, 3, 8, 8], "float32")
            with paddle.amp.auto_cast(custom_black_list=["conv2d"]):
                loss = m(x).mean()
            s = make_scaler()
            s.minimize(opt, s.scale(loss))
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        losses, scales = [], []
        for _ in range(steps):
            value, scale = exe.run(
                main, feed={"x": np.full([1, 3, 8, 8], fill, "float32")}, fetch_list=[loss, s._scale]
            )
            losses.append(float(value))
            scales.append(float(scale[0]))
        return losses, scales, s
    finally:
        paddle.disable_static()


def test_static_snippet_trains_three_steps_as_paddles_scaler():
    kw = dict(init_loss_scaling=1024)
    theirs = _train(lambda: paddle.amp.GradScaler(**kw), 1.0)
    ours = _train(lambda: ampsafe.paddle.GradScaler(**kw), 1.0)
    assert isinstance(ours[2], paddle.amp.GradScaler)
    assert ours[:2] == theirs[:2]
    assert theirs[0][0] != theirs[0][-1]  # it trained: the loss moved


def test_static_program_applies_the_cap_and_the_floor():
    kw = dict(init_loss_scaling=1024, incr_every_n_steps=1)
    bounds = dict(min_loss_scaling=256, max_loss_scaling=2048)
    assert _train(lambda: paddle.amp.GradScaler(**kw), 1.0, 4)[1] == [2048, 4096, 8192, 16384]
    assert _train(lambda: ampsafe.paddle.GradScaler(**kw, **bounds), 1.0, 4)[1] == [2048, 2048, 2048, 2048]
    assert _train(lambda: paddle.amp.GradScaler(**kw), float("nan"), 4)[1] == [512, 256, 128, 64]
    assert _train(lambda: ampsafe.paddle.GradScaler(**kw, **bounds), float("nan"), 4)[1] == [512, 256, 256, 256]


def test_static_heal_says_once_it_is_unavailable_and_runs_as_the_plain_scaler(monkeypatch):
    monkeypatch.setitem(scaler_module._STATIC_NOTE, "said", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kw = dict(init_loss_scaling=1024, on_floor="heal", patience=2)
        _, scales, _ = _train(lambda: ampsafe.paddle.GradScaler(**kw), float("nan"), 2)
        _train(lambda: ampsafe.paddle.GradScaler(**kw), 1.0, 1)
    notes = [w for w in caught if "static graph" in str(w.message)]
    assert len(notes) == 1
    assert "on_floor='heal'" in str(notes[0].message) and "patience=2" in str(notes[0].message)
    assert scales == [512, 256]  # overflowing steps back off in the program; nothing raised


def test_dygraph_scale_still_refuses_what_is_neither_a_tensor_nor_a_value():
    scaler = ampsafe.paddle.GradScaler(emulated=True)
    with pytest.raises(TypeError, match="paddle.Tensor or a PIR Value"):
        scaler.scale(np.ones(3, "float32"))
