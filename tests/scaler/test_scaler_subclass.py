"""ampsafe's scalers are subclasses of the frameworks' GradScalers (not look-alikes), keep the frameworks'
private state with its meaning, clamp an out-of-range initial scale instead of refusing it, and under
``ampsafe run`` every public spelling of a GradScaler builds ampsafe's."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings

import paddle
import pytest
import torch
from scaler_helpers import torch_model

import ampsafe.paddle
import ampsafe.torch
from ampsafe.errors import ConfigError

NEUTRAL = dict(min_scale=0.0, max_scale=float("inf"), hysteresis=1)


def test_torch_scaler_is_a_torch_grad_scaler_with_torchs_private_state():
    scaler = ampsafe.torch.GradScaler("cpu", init_scale=3.0, growth_factor=4.0, growth_interval=2)
    assert isinstance(scaler, torch.amp.GradScaler) and issubclass(ampsafe.torch.GradScaler, torch.GradScaler)
    assert scaler._init_scale == 3.0 and scaler._init_growth_tracker == 0
    assert scaler._scale is None and scaler._growth_tracker is None  # lazily created, as torch's
    assert scaler._growth_factor == 4.0 and scaler._backoff_factor == 0.5 and scaler._growth_interval == 2
    assert scaler._per_optimizer_states["any"] == torch.amp.grad_scaler._refresh_per_optimizer_state()

    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler._growth_tracker.dtype == torch.int32 and int(scaler._growth_tracker) == 1
    clone = pickle.loads(pickle.dumps(scaler))
    assert clone._init_scale == 3.0 and clone._init_growth_tracker == 1 and clone._scale is None


def test_paddle_scaler_is_a_paddle_grad_scaler_with_paddles_private_state():
    scaler = ampsafe.paddle.GradScaler(init_loss_scaling=64, incr_ratio=3.0, decr_every_n_nan_or_inf=2, emulated=True)
    assert isinstance(scaler, paddle.amp.GradScaler) and isinstance(scaler, paddle.amp.AmpScaler)
    assert issubclass(ampsafe.paddle.GradScaler, paddle.amp.AmpScaler)
    assert (scaler._incr_ratio, scaler._decr_ratio) == (3.0, 0.5)
    assert (scaler._incr_every_n_steps, scaler._decr_every_n_nan_or_inf) == (2000, 2)
    scaler._decr_ratio = 0.25  # Paddle's private setters reach the state machine
    assert scaler.get_decr_ratio() == 0.25 and scaler.state_dict()["decr_ratio"] == 0.25


def test_disabled_scalers_accept_what_the_frameworks_disabled_scalers_accept():
    assert not ampsafe.paddle.GradScaler(enable=False, incr_ratio=0.5).is_enable()
    assert paddle.amp.GradScaler(enable=False, incr_ratio=0.5).is_enable() is False
    assert not ampsafe.torch.GradScaler("cpu", enabled=False, growth_factor=0.5).is_enabled()
    with pytest.raises(ConfigError, match="growth_factor"):  # enabled, the same value is refused with its name
        ampsafe.torch.GradScaler("cpu", growth_factor=0.5)


@pytest.mark.parametrize(
    "build, bound",
    [
        (lambda: ampsafe.torch.GradScaler("cpu", init_scale=2.0**32), "max_scale"),
        (lambda: ampsafe.torch.GradScaler("cpu", init_scale=0.5), "min_scale"),
        (lambda: ampsafe.paddle.GradScaler(init_loss_scaling=1e38, emulated=True), "max_loss_scaling"),
    ],
)
def test_initial_scale_outside_the_bounds_is_clamped_with_one_warning(build, bound):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = build()
    assert len(caught) == 1 and f"pass {bound}=" in str(caught[0].message) and caught[0].filename == __file__
    getter = getattr(scaler, "get_scale", None) or scaler.get_loss_scaling
    assert getter() == (1.0 if bound == "min_scale" else 2.0**24)


def test_contradictory_bounds_still_raise():
    with pytest.raises(ConfigError, match="min_scale"):
        ampsafe.torch.GradScaler("cpu", init_scale=2.0**32, min_scale=8.0, max_scale=4.0)


def test_neutral_torch_scaler_overflowing_float32_matches_torch_without_numpy_warnings():
    def run(scaler):
        model = torch.nn.Linear(5, 1)
        torch.nn.init.constant_(model.weight, 0.1)
        opt = torch.optim.Adam(model.parameters())
        scaler.scale((model(torch.ones(1, 5)) * 1e-30).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        return float(scaler._scale), int(scaler._growth_tracker)

    kw = dict(growth_interval=1, growth_factor=2.0**4, init_scale=1e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = run(ampsafe.torch.GradScaler("cpu", **kw, **NEUTRAL))
    assert ours == run(torch.amp.GradScaler("cpu", **kw))


def test_device_scaler_keeps_torchs_deprecation_warning():
    from ampsafe.torch.scaler import device_scaler

    cpu_scaler = device_scaler(ampsafe.torch.GradScaler, "cpu")
    with pytest.warns(FutureWarning, match=r"`torch.cpu.amp.GradScaler\(args...\)` is deprecated"):
        scaler = cpu_scaler(init_scale=2.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 2.0 and scaler._device == "cpu"


_RUN_CHECK = """
import warnings, torch, paddle, ampsafe.torch, ampsafe.paddle
assert isinstance(torch.GradScaler("cpu"), ampsafe.torch.GradScaler)
assert isinstance(torch.amp.grad_scaler.GradScaler("cpu"), ampsafe.torch.GradScaler)
for alias in (torch.cpu.amp.GradScaler, torch.cpu.amp.grad_scaler.GradScaler, torch.cuda.amp.GradScaler):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = alias()
    assert isinstance(scaler, ampsafe.torch.GradScaler), alias
    assert any(w.category is FutureWarning and "is deprecated" in str(w.message) for w in caught), alias
plain = ampsafe.torch.GradScaler("cpu")  # built directly: still a torch.amp.GradScaler to a library's check
assert isinstance(plain, torch.amp.GradScaler) and isinstance(plain, torch.GradScaler)
assert isinstance(paddle.amp.GradScaler(), ampsafe.paddle.GradScaler)
assert isinstance(paddle.amp.grad_scaler.GradScaler(), ampsafe.paddle.GradScaler)
amp = paddle.amp.AmpScaler(enable=False)
assert isinstance(amp, ampsafe.paddle.GradScaler) and isinstance(amp, paddle.amp.AmpScaler)
assert isinstance(ampsafe.paddle.GradScaler(), paddle.amp.GradScaler)
print("every spelling ok")
"""


def _ampsafe_run(*command: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", "run", "--", sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


@pytest.mark.slow
def test_every_grad_scaler_spelling_builds_ampsafes_scaler_under_ampsafe_run(tmp_path):
    one_line = "import torch, ampsafe.torch; print(isinstance(torch.GradScaler('cpu'), ampsafe.torch.GradScaler))"
    proc = _ampsafe_run("-c", one_line, cwd=str(tmp_path))
    assert proc.returncode == 0 and "True" in proc.stdout.splitlines(), proc.stdout + proc.stderr[-3000:]
    (tmp_path / "spellings.py").write_text(_RUN_CHECK)
    proc = _ampsafe_run(str(tmp_path / "spellings.py"), cwd=str(tmp_path))
    assert proc.returncode == 0 and "every spelling ok" in proc.stdout, proc.stderr[-3000:]
