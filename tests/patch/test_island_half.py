"""An FP32 island in a model cast to float16 (``.half()``, DeepSpeed's ``"fp16"``): float32 compute inside the
module, the float16 parameters untouched and trained through it."""

from __future__ import annotations

import torch
from torch import nn

import ampsafe


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
        model[2].weight.fill_(1e4)  # 4 inputs of 4 (ones in, ones weights) times 1e4: 1.6e5, past float16's 65504
    return model.half()


def test_an_island_in_a_half_model_computes_in_float32_and_trains_its_float16_weights():
    x = torch.ones(2, 4, dtype=torch.float16)
    native = _model()
    assert not torch.isfinite(native(x)).all()  # the float16 head overflows
    model = _model()
    ampsafe.patch(model, policy="island", paths=["2"])
    out = model(x)
    assert out.dtype == torch.float32 and torch.isfinite(out).all() and out.abs().max() > 65504
    assert all(p.dtype == torch.float16 for p in model.parameters())  # the weights stay what the engine made them
    (out / 1e6).sum().backward()
    assert model[2].weight.grad is not None and model[2].weight.grad.dtype == torch.float16
    assert isinstance(model[2].weight, nn.Parameter)  # put back after the forward


def test_an_island_in_a_half_model_returns_float16_where_float16_holds_its_output():
    """Without autocast nothing casts an island's float32 output for the next float16 layer: an output float16
    holds goes back to float16 (before, ``model[2]`` raised "mat1 and mat2 must have the same dtype, but got Float
    and Half")."""
    x = torch.ones(2, 4, dtype=torch.float16)
    model = _model()
    ampsafe.patch(model, policy="island", paths=["0"])  # its output is 4: float16 holds it
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = model(x)
    assert seen == [torch.float16] and out.dtype == torch.float16
    assert not torch.isfinite(out).all()  # the float16 head still overflows: it is not an island


def test_under_autocast_an_island_returns_float32():
    model = _model().float()
    ampsafe.patch(model, policy="island", paths=["0"])
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.float16):
        model(torch.ones(2, 4))
    assert seen == [torch.float32]  # autocast casts it for the next op
