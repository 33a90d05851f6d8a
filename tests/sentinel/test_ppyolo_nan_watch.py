"""The PP-YOLO seed report (loss = nan mid-training), reproduced on ppdet's real PP-YOLO (tiny config) without
injecting a NaN: a blown-up regression output makes ``decode_yolo``'s ``exp`` overflow float32 (input > 88.7).
The loss of that step stays finite, its gradients do not, and the *next* step's loss is nan."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ampsafe

paddle = pytest.importorskip("paddle")


@pytest.fixture(scope="module")
def ppyolo():
    from ampsafe_lab.workloads import build

    workload = build("ppyolo", seed=0, config="tiny")
    layers = dict(workload.model.named_sublayers())
    for i in range(3):  # every anchor's w and h channel of every output: regression output ~ 100
        head = layers[f"yolo_head.yolo_output.{i}"]
        bias = head.bias.numpy()
        per_anchor = bias.shape[0] // 3
        for anchor in range(3):
            bias[[anchor * per_anchor + 2, anchor * per_anchor + 3]] = 100.0
        head.bias.set_value(bias)
    state = {k: v.numpy().copy() for k, v in workload.model.state_dict().items()}
    return workload, state


def _restore(workload, state):
    workload.model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    for p in workload.model.parameters():
        p.clear_gradient(set_to_zero=False)


def test_blown_up_regression_gives_nan_loss_one_step_later(ppyolo):
    workload, state = ppyolo
    _restore(workload, state)
    optimizer = workload.make_optimizer(1e-3)
    loss = workload.loss(workload.batch(0))
    loss.backward()
    assert math.isfinite(float(loss))  # this step looks healthy...
    assert any(not np.isfinite(p.grad.numpy()).all() for p in workload.model.parameters() if p.grad is not None)
    optimizer.step()
    assert math.isnan(float(workload.loss(workload.batch(1))))  # ...and the next one is the report's nan


def test_watch_names_the_box_decoding_exp_as_numerical_origin(ppyolo):
    workload, state = ppyolo
    _restore(workload, state)
    with ampsafe.watch(workload.model, on_nonfinite="record") as w:
        workload.loss(workload.batch(0)).backward()
    _restore(workload, state)
    assert len(w.events) == 1
    err = w.events[0]
    assert (err.phase, err.module, err.op, err.kind, err.sample) == ("forward", "yolo_head.loss", "exp", "numerical", 0)
    assert err.stats["inputs"][0]["absmax"] > 88.72  # float32's exp overflows above log(3.4e38)


def test_grad_scaler_guard_skips_the_step_and_weights_stay_finite(ppyolo):
    workload, state = ppyolo
    _restore(workload, state)
    optimizer = workload.make_optimizer(1e-3)
    scaler = ampsafe.paddle.GradScaler(init_loss_scaling=1024.0, emulated=True)  # scales on this CPU as on a GPU
    scaler.scale(workload.loss(workload.batch(0))).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
    assert scaler.stats.skipped_steps == 1
    assert all(np.isfinite(p.numpy()).all() for p in workload.model.parameters())
    assert math.isfinite(float(workload.loss(workload.batch(1))))
    _restore(workload, state)
