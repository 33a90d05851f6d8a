"""``disabled_reason``: a scaler that does not scale says why (the run summary prints it); None when it scales."""

from __future__ import annotations

import pytest
import torch

from ampsafe.paddle import GradScaler as PaddleScaler
from ampsafe.torch import GradScaler as TorchScaler


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_torch_cuda_scaler_without_cuda_warns_disables_and_says_why():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = TorchScaler("cuda")
    assert not scaler.is_enabled() and scaler.disabled_reason == "disabled (CUDA not available)"


def test_torch_scaler_disabled_by_the_script_says_so():
    assert TorchScaler("cpu", enabled=False).disabled_reason == "disabled by the script (enabled=False)"
    assert TorchScaler("cpu").disabled_reason is None
    assert TorchScaler("cpu", fp32_guard=True).disabled_reason is None  # it does not scale, but it guards


def test_paddle_scaler_disabled_by_the_script_says_so():
    assert PaddleScaler(enable=False).disabled_reason == "disabled by the script (enable=False)"
    assert PaddleScaler(emulated=True).disabled_reason is None
    assert PaddleScaler(fp32_guard=True).disabled_reason is None


def test_paddle_scaler_on_a_cpu_place_without_emulation_says_why():
    import paddle

    if paddle.device.get_device() != "cpu":
        pytest.skip("needs Paddle on a CPU place")
    with pytest.warns(UserWarning, match="AmpScaler can only be enabled on CUDAPlace"):
        scaler = PaddleScaler()
    assert not scaler.is_enable() and scaler.disabled_reason.startswith("disabled (CPU place")
    assert "--emulate-fp16" in scaler.disabled_reason and "emulated=True" in scaler.disabled_reason
