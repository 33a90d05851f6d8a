"""A model a scaler, healer or ``ampsafe run``'s FP32 guard hooked is freed once the script drops it.

Sweeps, k-fold loops and notebooks build many models in one process: ampsafe's hooks must not keep the dropped
ones (and their weights) in memory, nor leave their class's ``__call__`` patched.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
import torch

import ampsafe
from ampsafe.core import ledger
from ampsafe.torch import GradScaler
from ampsafe_lab.workloads.heal_runs import train_grow


def _callhooks_classes() -> list:
    return [owner for party, owner, _attr in ledger.live() if party == "ampsafe.torch.callhooks"]


class _Net(torch.nn.Module):  # a class of this test's own: no other test's model patches it
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)  # two: the optimizer's owner is _Net

    def forward(self, x):
        return self.fc2(self.fc1(x))


def test_torch_scaler_and_healer_keep_no_model_alive_once_dropped():
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", on_floor="heal")
    healer = ampsafe.heal(model, scaler=scaler, target="cpu")
    for step in range(2):
        loss = model(torch.randn(3, 4)).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)  # the scaler resolves its model and hooks it at its first step
        # the hooks fire while the objects live: the healer's capture, then the scaler's, have this batch
        assert healer.last_inputs is not None and (step == 0 or scaler.capture.latest is not None)
        assert scaler.model is model and healer.model is model
        scaler.update()
    assert _Net in _callhooks_classes() and "__call__" in vars(_Net)

    ref = weakref.ref(model)
    del model, opt, scaler, healer, loss
    gc.collect()
    assert ref() is None
    assert _Net not in _callhooks_classes() and "__call__" not in vars(_Net)


def test_torch_capture_dropped_with_its_scaler_while_the_model_lives():
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(torch.randn(3, 4)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert _Net in _callhooks_classes()
    del scaler
    gc.collect()
    # the script keeps training the model without that scaler: its class is no longer hooked
    assert _Net not in _callhooks_classes() and "__call__" not in vars(_Net)
    assert model(torch.randn(1, 4)).shape == (1, 2)


def test_torch_model_healed_by_its_scaler_is_freed():
    run = train_grow("heal", steps=5, recipe={"init_scale": 4.0}, batch_hook=lambda step, x, model: x * 1e5)
    assert run["scaler"].stats.heals  # the healer found the model and islanded it
    cls = type(run["model"])
    ref = weakref.ref(run["model"])
    del run
    gc.collect()
    assert ref() is None
    assert cls not in _callhooks_classes()


# what both frameworks' run scripts check once their models are dropped
FREED_AFTER_THE_RUN = """
ref_a, ref_b, g = train()
gc.collect()
assert ref_a() is None and ref_b() is None, "a model of the run is still alive"
assert g.models() == [] and g._tracked == {}
assert g.to_dict()["model"] == "Linear"  # the summary still names it
installer.uninstall()
"""

RUN = (
    """
import gc, weakref
import torch
from ampsafe.core import ledger
from ampsafe.run import guard, installer
installer.install(quiet=True)

def train():
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")  # the run's scaler, kept by the run for its summary
    scaler.scale(a(torch.randn(3, 4)).sum()).backward()
    scaler.step(opt_a)
    scaler.update()
    b(torch.randn(3, 4)).sum().backward()
    opt_b.step()  # no scaler: the FP32 guard's step, which hooked b's forward
    (g,) = guard.guards()[-1:]
    assert any(m is b for m in g.models()), g.models()
    return weakref.ref(a), weakref.ref(b), g

"""
    + FREED_AFTER_THE_RUN
    + """
assert not [p for p in ledger.live() if p[0] == "ampsafe.torch.callhooks"], ledger.live()
print("ok")
"""
)


@pytest.mark.slow  # a subprocess: ampsafe run's install is process-wide
def test_torch_run_scaler_and_fp32_guard_keep_no_model_alive():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["ok"], proc.stdout + proc.stderr


def test_paddle_model_healed_by_its_scaler_is_freed():
    import paddle

    from ampsafe.paddle import GradScaler as PaddleScaler
    from ampsafe.paddle import emulate_fp16

    paddle.seed(0)
    nn = paddle.nn
    model = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(), nn.Conv2D(8, 1, 1))
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    scaler = PaddleScaler(init_loss_scaling=4.0, min_loss_scaling=1.0, on_floor="heal", emulated=True)
    ampsafe.heal(model, scaler=scaler)
    rng = np.random.default_rng(0)
    with emulate_fp16(model):
        for _ in range(3):
            x = paddle.to_tensor(rng.standard_normal((4, 3, 8, 8)).astype("float32") * 1e5)
            loss = model(x).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
    assert scaler.stats.heals and scaler.model is model  # healed: the healer found the model

    ref = weakref.ref(model)
    del model, opt, scaler, loss, x
    gc.collect()
    assert ref() is None


PADDLE_RUN = (
    """
import gc, weakref
import paddle
from ampsafe.run import guard, installer
installer.install(quiet=True)

def train():
    a, b = paddle.nn.Linear(4, 2), paddle.nn.Linear(4, 2)
    opt_a = paddle.optimizer.SGD(learning_rate=0.1, parameters=a.parameters())
    opt_b = paddle.optimizer.SGD(learning_rate=0.1, parameters=b.parameters())
    scaler = paddle.amp.GradScaler()  # the run's scaler, kept by the run for its summary
    scaler.scale(a(paddle.randn([3, 4])).sum()).backward()
    scaler.step(opt_a)
    scaler.update()
    b(paddle.randn([3, 4])).sum().backward()
    opt_b.step()  # no scaler: the FP32 guard's step, which hooked b's forward
    (g,) = guard.guards()[-1:]
    assert any(m is b for m in g.models()), g.models()
    return weakref.ref(a), weakref.ref(b), g

"""
    + FREED_AFTER_THE_RUN
    + """
print("ok")
"""
)


@pytest.mark.slow  # a subprocess: ampsafe run's install is process-wide
def test_paddle_run_scaler_and_fp32_guard_keep_no_model_alive():
    script = textwrap.dedent(PADDLE_RUN)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["ok"], proc.stdout + proc.stderr
