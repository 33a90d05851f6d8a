"""PyTorch's own GradScaler tests (the recorded copy ``torch_gradscaler_tests.py``) on the CPU, each run against
torch's scaler and against ampsafe's put in place of every name the tests build a scaler through
(``torch.GradScaler``, ``torch.amp.GradScaler``, ``torch.amp.grad_scaler.GradScaler``, ``torch.cpu.amp`` and
``torch.cuda.amp``'s), as ``ampsafe run`` does:

* ``torch``: torch's own ``torch.amp.GradScaler``;
* ``ampsafe-neutral``: ``ampsafe.torch.GradScaler`` in its torch-identical settings
  (``min_scale=0, max_scale=inf, hysteresis=1``);
* ``ampsafe-default``: ``ampsafe.torch.GradScaler`` with its defaults (floor 1, cap 2**24, hysteresis 1).

Every test passes in all three; ``DEFAULT_NOTES`` lists where the defaults behave differently inside a passing
test (a floor or cap difference, with its reason).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch_gradscaler_tests as upstream
from torch_harness import cases

import ampsafe.torch
from ampsafe.torch.scaler import device_scaler

NEUTRAL = {"min_scale": 0.0, "max_scale": float("inf"), "hysteresis": 1}

# At ampsafe's defaults, what differs inside a passing test, and why (one line each).
DEFAULT_NOTES = {
    "test_grad_scale_will_not_overflow": "init_scale=1e38 starts at the cap 2**24, with one warning (torch keeps 1e38)",
}


class NeutralGradScaler(ampsafe.torch.GradScaler):
    """ampsafe's scaler in torch-identical settings (module level, so that the pickling tests can find it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**NEUTRAL, **kwargs})


VARIANTS = {"torch": None, "ampsafe-neutral": NeutralGradScaler, "ampsafe-default": ampsafe.torch.GradScaler}
CASES = cases(upstream.TestTorchDeviceType)


@pytest.fixture
def scaler_variant(request, monkeypatch):
    """Put the variant's class in place of every name the upstream tests build a scaler through."""
    scaler = VARIANTS[request.param]
    if scaler is not None:
        for module in (torch, torch.amp, torch.amp.grad_scaler):
            monkeypatch.setattr(module, "GradScaler", scaler)
        for device in ("cpu", "cuda"):
            alias = device_scaler(scaler, device)
            for module in (getattr(torch, device).amp, getattr(torch, device).amp.grad_scaler):
                monkeypatch.setattr(module, "GradScaler", alias)
    return request.param


@pytest.mark.parametrize("scaler_variant", list(VARIANTS), indirect=True)
@pytest.mark.parametrize("name, kwargs", [(n, k) for n, k, _ in CASES], ids=[i for _, _, i in CASES])
def test_pytorch_gradscaler_test_passes(scaler_variant, name, kwargs):
    torch.manual_seed(0)
    case = upstream.TestTorchDeviceType(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(case, name)(**kwargs)
    clamped = [w for w in caught if "lies above max_scale" in str(w.message)]
    if scaler_variant == "ampsafe-default" and name in DEFAULT_NOTES:
        assert len(clamped) == 1  # the documented difference happened, and said so once
    else:
        assert not clamped
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning) and "overflow" in str(w.message)]


def test_the_recorded_copy_holds_the_tests_the_readme_counts():
    names = {name for name, _, _ in CASES}
    assert len(CASES) == 29 and len(names) == 16
    assert set(DEFAULT_NOTES) <= names
