"""A scan is an observation: a forward that writes a parameter in place is refused by name (torch and Paddle)."""

from __future__ import annotations

import pytest

import ampsafe
from ampsafe.errors import UnsupportedModelError


def test_torch_forward_writing_a_parameter_is_named():
    torch = pytest.importorskip("torch")

    class Writes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            with torch.no_grad():
                self.fc.weight.mul_(1.0)
            return self.fc(x)

    with pytest.raises(UnsupportedModelError, match=r"wrote parameters in place \(fc\.weight\)"):
        ampsafe.scan(Writes(), (torch.randn(1, 2),))


def test_paddle_forward_writing_a_parameter_is_named():
    paddle = pytest.importorskip("paddle")

    class Writes(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(2, 2)

        def forward(self, x):
            with paddle.no_grad():
                self.fc.weight.scale_(1.0)
            return self.fc(x)

    with pytest.raises(UnsupportedModelError, match=r"wrote parameters in place \(fc\.weight\)"):
        ampsafe.scan(Writes(), (paddle.randn([1, 2]),))
