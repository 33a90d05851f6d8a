"""Capture hooks survive the ecosystem: ``torch.save(model)``, ``copy.deepcopy`` and EMA copies work while a
model's inputs are captured, and a copy neither carries the hook nor feeds the live capture."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from ampsafe.core.capture import InputCapture  # noqa: E402
from ampsafe.torch.backend import BACKEND  # noqa: E402
from ampsafe.torch.callhooks import hooked  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x, scale=1.0):
        return self.body(x) * scale


class SubNet(Net):
    pass


def test_save_deepcopy_and_ema_copies_work_and_copies_do_not_feed_the_capture():
    model = Net()
    capture = InputCapture(BACKEND, model)
    x = torch.randn(3, 4)
    model(x, scale=2.0)
    assert capture.latest[0][0] is x and capture.latest[1] == {"scale": 2.0}
    capture.drop()

    twin = copy.deepcopy(model)
    ema = torch.optim.swa_utils.AveragedModel(model)  # deep-copies the model, as EMA helpers do
    twin(x)
    ema(x)
    assert capture.latest is None  # the copies' forwards are not the model's
    assert not hooked(twin) and hooked(model)

    buffer = io.BytesIO()
    torch.save(model, buffer)  # pickles the module: nothing of ampsafe's is in it
    torch.save(copy.deepcopy(model).half(), io.BytesIO())
    assert b"ampsafe" not in buffer.getvalue()
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded(x)
    assert capture.latest is None and not hooked(loaded)
    pickle.dumps(ema)

    model(x)
    assert capture.latest is not None
    capture.remove()
    assert "__call__" not in Net.__dict__  # the class is as it was once its last hooked instance is released


def test_a_subclass_instance_and_its_base_are_captured_apart():
    base, sub = Net(), SubNet()
    base_capture, sub_capture = InputCapture(BACKEND, base), InputCapture(BACKEND, sub)
    x = torch.randn(2, 4)
    sub(x)
    assert sub_capture.latest is not None and base_capture.latest is None
    base(x)
    assert base_capture.latest is not None
    sub_capture.remove()
    base_capture.remove()
    assert "__call__" not in Net.__dict__ and "__call__" not in SubNet.__dict__
