"""``InputCapture``: the inputs of the latest forward by reference, and replays that do not overwrite them."""

from __future__ import annotations

import torch

from ampsafe._framework import backend_of
from ampsafe.core.capture import InputCapture


def test_capture_keeps_the_step_and_a_paused_replay_leaves_it_as_recorded():
    model = torch.nn.Linear(4, 2)
    states = iter(["step precision", "replay precision"])
    capture = InputCapture(backend_of(model), model, state=lambda: next(states))
    x = torch.randn(3, 4)
    model(x)
    (args, kwargs), state = capture.latest, capture.state
    assert args[0] is x and kwargs == {} and state == "step precision"  # a reference, not a copy
    with capture.paused():
        model(torch.zeros(3, 4))  # e.g. the floor's float32 replay
    assert capture.latest[0][0] is x and capture.state == "step precision"
    capture.drop()
    assert capture.latest is None and capture.state is None
    capture.remove()
    model(x)
    assert capture.latest is None and not capture.attached


class _Keywords(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)

    def forward(self, x, mask=None):
        return self.proj(x if mask is None else x * mask)


def test_a_heal_replays_positional_and_keyword_inputs_named_by_the_forward():
    from ampsafe.healing import Healer

    model = _Keywords()
    healer = Healer(model, backend=backend_of(model))
    x, mask = torch.randn(3, 4), torch.zeros(3, 4)
    model(x, mask=mask)
    inputs = healer.last_inputs  # the one rule (core.capture.example_inputs): the keyword is not dropped
    assert inputs.keys() == {"x", "mask"} and inputs["x"] is x and inputs["mask"] is mask
    healer.detach()
