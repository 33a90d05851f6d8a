"""Data is never an overflow: a NaN pixel under an active loss scale skips the step and leaves the scale alone.

Real torchvision SqueezeNet 1.1 / Paddle ResNet-18 models train under float16 (torch's CPU autocast; Paddle's AMP emulated) with
ampsafe's GradScaler; one pixel of one image of the step-2 batch is NaN. The step is skipped as a data step
(``StepDecision.bad_input`` names the input and its sample), the scale, its trackers and the parameters are as
they were, no overflow, floor hit or heal is counted, and training goes on with finite parameters and (Paddle's
ResNet: the BatchNorm statistics the NaN forward poisoned restart) finite running statistics. At the floor the same NaN raises
nothing (on_floor="raise"): without the rule it was a floor hit, and a few corrupt files decayed the scale.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

NAN_STEP, NAN_SAMPLE, STEPS = 2, 1, 4


def _images(step: int) -> np.ndarray:
    x = np.random.default_rng(step).random((4, 3, 32, 32), dtype=np.float32)
    if step == NAN_STEP:
        x[NAN_SAMPLE, 0, 5, 7] = math.nan
    return x


def _check(decisions: list, scaler, scales: list, init: float) -> None:
    data = [d for d in decisions if d.bad_input is not None]
    assert [d.step for d in data] == [NAN_STEP]
    (d,) = data
    assert d.found_inf and d.skipped and not d.overflow and not d.backed_off and not d.floor_hit
    assert d.bad_input.where == f"args[0][{NAN_SAMPLE}]" and d.bad_input.sample == NAN_SAMPLE
    assert d.scale == d.next_scale == init
    stats = scaler.stats
    assert (stats.total_steps, stats.input_steps, stats.skipped_steps) == (STEPS, 1, 1)
    assert stats.overflow_steps == 0 and stats.floor_hits == 0 and not stats.heals
    assert scales == [init] * STEPS  # the scale never moved, before, at or after the bad sample


# ------------------------------------------------------------------------------------------------------ torch
def _torch_run(**scaler_kwargs):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from ampsafe.torch import GradScaler

    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1(num_classes=4)  # CPU float16 convs are slow: the smallest
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = GradScaler("cpu", **scaler_kwargs)
    decisions, scales, unchanged = [], [], None
    scaler.add_step_callback(decisions.append)
    for step in range(STEPS):
        before = [p.detach().clone() for p in model.parameters()]
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(_images(step))), torch.arange(4))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        if step == NAN_STEP:
            unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return scaler, decisions, scales, unchanged, finite


def test_torch_nan_pixel_is_a_data_step_and_the_scale_stays():
    scaler, decisions, scales, unchanged, finite = _torch_run(init_scale=1024.0, on_floor="heal")
    _check(decisions, scaler, scales, 1024.0)
    assert unchanged and finite  # skipped: the optimizer did not step on the NaN gradients


def test_torch_nan_pixel_at_the_floor_is_no_floor_hit():
    scaler, decisions, scales, _, finite = _torch_run(init_scale=64.0, min_scale=64.0, on_floor="raise")
    _check(decisions, scaler, scales, 64.0)
    assert finite


# ------------------------------------------------------------------------------------------------------ Paddle
def _paddle_run(**scaler_kwargs):
    paddle = pytest.importorskip("paddle")
    from ampsafe.paddle import GradScaler, emulate_fp16

    paddle.seed(0)
    model = paddle.vision.models.resnet18(num_classes=4)
    opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(emulated=True, **scaler_kwargs)
    decisions, scales, unchanged = [], [], None
    scaler.add_step_callback(decisions.append)
    labels = paddle.arange(4)
    trained = [p for p in model.parameters() if not p.stop_gradient]  # not BatchNorm's _mean / _variance
    with emulate_fp16(model):
        for step in range(STEPS):
            before = [p.numpy().copy() for p in trained]
            with paddle.amp.auto_cast(level="O1"):
                loss = paddle.nn.functional.cross_entropy(model(paddle.to_tensor(_images(step))), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            scales.append(scaler.get_loss_scaling())
            if step == NAN_STEP:
                unchanged = all(np.array_equal(a, p.numpy()) for a, p in zip(before, trained))
    finite = all(bool(np.isfinite(p.numpy()).all()) for p in model.parameters())  # running statistics too
    return scaler, decisions, scales, unchanged, finite


def test_paddle_nan_pixel_is_a_data_step_and_the_scale_stays():
    scaler, decisions, scales, unchanged, finite = _paddle_run(init_loss_scaling=1024.0, on_floor="heal")
    _check(decisions, scaler, scales, 1024.0)
    assert unchanged and finite


def test_paddle_nan_pixel_at_the_floor_is_no_floor_hit():
    scaler, decisions, scales, _, finite = _paddle_run(init_loss_scaling=64.0, min_loss_scaling=64.0, on_floor="raise")
    _check(decisions, scaler, scales, 64.0)
    assert finite
