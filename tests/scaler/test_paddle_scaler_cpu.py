"""ampsafe.paddle.GradScaler on a CPU place (real Paddle): off there exactly as Paddle's own scaler, with its
warning, unless float16 is emulated (``emulated=True``, an open ``emulate_fp16`` block, ``amp_emulation``)."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import paddle
import pytest

import ampsafe
from ampsafe.errors import ConfigError
from ampsafe.paddle import GradScaler, amp_emulation, emulate_fp16

pytestmark = pytest.mark.skipif(paddle.device.get_device() != "cpu", reason="needs Paddle on a CPU place")

X = np.random.default_rng(3).standard_normal((8, 4)).astype("float32")


def _model(seed: int = 0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))


def _built(cls, **kwargs):
    """(the scaler, the messages and categories of the warnings its construction raised)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = cls(**kwargs)
    return scaler, [(str(w.message), w.category) for w in caught]


def _train(scaler, minimize: bool):
    """Two SGD steps through ``scaler`` (``step`` + ``update``, or ``minimize``); the parameters after."""
    model = _model()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    for _ in range(2):
        loss = model(paddle.to_tensor(X)).pow(2).mean()
        scaled = scaler.scale(loss)
        assert scaled is loss  # unscaled: the same tensor, as Paddle's disabled scaler returns it
        scaled.backward()
        if minimize:
            scaler.minimize(opt, scaled)
        else:
            scaler.step(opt)
            scaler.update()
        opt.clear_grad()
    return [p.numpy().copy() for p in model.parameters()]


def test_without_emulation_it_warns_and_disables_itself_as_paddles_does():
    ours, ours_warned = _built(GradScaler, init_loss_scaling=1024.0)
    theirs, theirs_warned = _built(paddle.amp.GradScaler, init_loss_scaling=1024.0)
    assert ours_warned == theirs_warned and len(ours_warned) == 1
    message, category = ours_warned[0]
    assert category is UserWarning and message.startswith("AmpScaler can only be enabled on CUDAPlace")
    assert not ours.is_enable() and not theirs.is_enable()
    assert not ours.is_use_dynamic_loss_scaling() and ours.state_dict() == {} == theirs.state_dict()
    assert ours.disabled_reason.startswith("disabled (CPU place")
    assert "--emulate-fp16" in ours.disabled_reason and "emulated=True" in ours.disabled_reason


@pytest.mark.parametrize("minimize", [False, True], ids=["step", "minimize"])
def test_disabled_steps_update_the_parameters_as_paddles_disabled_scaler(minimize):
    initial = [p.numpy().copy() for p in _model().parameters()]
    ours = _train(_built(GradScaler)[0], minimize)
    theirs = _train(_built(paddle.amp.GradScaler)[0], minimize)
    assert not all(np.array_equal(a, b) for a, b in zip(initial, ours))  # the optimizer stepped
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_a_disabled_scaler_pickles_disabled():
    scaler = _built(GradScaler)[0]
    loaded = pickle.loads(pickle.dumps(scaler))
    assert not loaded.is_enable() and loaded.disabled_reason == scaler.disabled_reason


def _assert_scales(scaler, warned, model):
    assert warned == [] and scaler.is_enable() and scaler.disabled_reason is None
    loss = model(paddle.to_tensor(X)).pow(2).mean()
    assert float(scaler.scale(loss)) == pytest.approx(float(loss) * 256.0, rel=1e-6)


def test_emulated_true_scales_as_on_a_gpu():
    scaler, warned = _built(GradScaler, init_loss_scaling=256.0, emulated=True)
    _assert_scales(scaler, warned, _model())


def test_built_inside_an_open_emulate_fp16_block_it_scales():
    model = _model()
    with emulate_fp16(model):
        scaler, warned = _built(GradScaler, init_loss_scaling=256.0)
        _assert_scales(scaler, warned, model)


def test_with_amp_emulation_installed_it_scales():
    amp_emulation.install()
    try:
        scaler, warned = _built(GradScaler, init_loss_scaling=256.0)
        _assert_scales(scaler, warned, _model())
    finally:
        amp_emulation.uninstall()
    assert not _built(GradScaler)[0].is_enable()  # uninstalled: off on the CPU again


def test_fp32_guard_is_not_disabled_on_a_cpu_and_still_guards():
    scaler, warned = _built(GradScaler, fp32_guard=True)
    assert warned == [] and scaler.disabled_reason is None and not scaler.is_enable()
    model = _model()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    before = [p.numpy().copy() for p in model.parameters()]
    loss = model(paddle.to_tensor(X * np.float32("nan"))).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.stats.skipped_steps == 1
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))


def test_enable_false_on_a_cpu_is_disabled_by_the_script_without_a_warning():
    scaler, warned = _built(GradScaler, enable=False)
    assert warned == [] and scaler.disabled_reason == "disabled by the script (enable=False)"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_emulated_must_be_a_bool(value):
    with pytest.raises(ConfigError, match="emulated must be a bool"):
        GradScaler(emulated=value)
    assert issubclass(ConfigError, ampsafe.AmpSafeError)


def _grouped_adamw(model):
    params = model.parameters()
    return paddle.optimizer.AdamW(
        learning_rate=0.01, parameters=[{"params": params[:2]}, {"params": params[2:], "learning_rate": 0.05}]
    )


def test_minimize_steps_an_optimizer_built_with_parameter_groups_where_paddles_raises():
    """Paddle's own ``GradScaler.minimize`` raises on an optimizer built with parameter groups (its
    ``Optimizer.minimize`` hands the group dicts to ``backward``; PaddleDetection's RT-DETRv2 under ``--amp`` stops
    there); ampsafe's takes the step each group asks for, the same as an unscaled float32 ``step()``."""
    x = paddle.to_tensor(X)
    reference = _model()
    opt = _grouped_adamw(reference)
    reference(x).pow(2).mean().backward()
    opt.step()
    expected = [p.numpy().copy() for p in reference.parameters()]
    amp_emulation.install()
    try:
        theirs_model = _model()
        theirs = paddle.amp.GradScaler(init_loss_scaling=256.0)
        scaled = theirs.scale(theirs_model(x).pow(2).mean())
        scaled.backward()
        with pytest.raises(TypeError, match="must be list of Tensor, but got dict"):
            theirs.minimize(_grouped_adamw(theirs_model), scaled)
        model = _model()
        before = [p.numpy().copy() for p in model.parameters()]
        ours = GradScaler(init_loss_scaling=256.0)
        scaled = ours.scale(model(x).pow(2).mean())
        scaled.backward()
        ours.minimize(_grouped_adamw(model), scaled)
    finally:
        amp_emulation.uninstall()
    after = [p.numpy() for p in model.parameters()]
    assert all(not np.array_equal(a, b) for a, b in zip(after, before))  # every group stepped
    for a, e in zip(after, expected):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7)  # the scale of 256 (a power of two) unscaled exactly
    assert ours.get_loss_scaling() == 256.0
