"""``amp_metrics``: the five ``amp/*`` names from ampsafe's scalers (torch and Paddle), the scale alone from a
framework's own scaler, nothing without a scaler; and no integration module imports its host on import."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from ampsafe.integrations.metrics import NAMES, amp_metrics

ALL = {"amp/loss_scale", "amp/overflow_steps", "amp/skipped_steps", "amp/heals", "amp/floor_hits"}


def test_the_names_are_the_issue_s_names():
    assert set(NAMES) == ALL


def test_torch_scalers_ampsafe_s_counts_and_torch_s_scale_only():
    torch = pytest.importorskip("torch")
    import ampsafe.torch

    ours = ampsafe.torch.GradScaler("cpu", init_scale=1024.0)
    assert amp_metrics(ours) == {name: 0.0 for name in ALL} | {"amp/loss_scale": 1024.0}
    assert amp_metrics(torch.amp.GradScaler("cpu", init_scale=512.0)) == {"amp/loss_scale": 512.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        disabled = torch.amp.GradScaler("cpu", enabled=False)
    assert amp_metrics(disabled) == {"amp/loss_scale": 1.0}
    assert amp_metrics(None) == {}


def test_paddle_scalers_ampsafe_s_counts_and_paddle_s_scale_only():
    paddle = pytest.importorskip("paddle")
    import ampsafe.paddle

    ours = ampsafe.paddle.GradScaler(init_loss_scaling=2048.0, emulated=True)
    assert amp_metrics(ours) == {name: 0.0 for name in ALL} | {"amp/loss_scale": 2048.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = paddle.amp.GradScaler(init_loss_scaling=2048.0)  # disabled on a CPU: Paddle scales nothing
    assert amp_metrics(plain) == {"amp/loss_scale": 1.0}


def test_the_integration_modules_import_no_host():
    code = (
        "import sys, ampsafe.integrations.metrics, ampsafe.integrations.hf, ampsafe.integrations.lightning, "
        "ampsafe.integrations.tensorboard, ampsafe.integrations.mmengine, ampsafe.integrations.ultralytics\n"
        "hosts = ('torch', 'paddle', 'transformers', 'lightning', 'mmengine', 'ultralytics', 'tensorboard', 'tensorboardX')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in hosts))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
