"""Attention masks in every common spelling are not overflows (the rule: ``ampsafe.core.graph.MASK_FILL_OPS``).

A mask's fill value (``finfo(float32).min``, ``-inf``) enters the scores through an additive float mask, through
``where(mask, scores, fill)`` or through ``masked_fill(bool_mask, <number>)``, whose only float input is the
path's own tensor. Ending in a softmax, those lanes are what the mask meant; reaching a matmul or the output,
they are values and count. HF's DeBERTa masks its scores with ``masked_fill(~mask, torch.finfo(dtype).min)``.
"""

from __future__ import annotations

import pytest

import ampsafe

SPELLINGS = ("masked_fill", "masked_fill_", "where_number", "where_tensor", "additive", "setitem")


def _risky(report) -> list:
    return [(p.start, p.amax) for p in report.paths if p.risky]


# ------------------------------------------------------------------------------------------------------ torch
def _torch_attention(spelling: str, to_softmax: bool = True):
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x, mask):
            scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4
            fill = torch.finfo(scores.dtype).min
            if spelling == "masked_fill":
                scores = scores.masked_fill(~mask, fill)
            elif spelling == "masked_fill_":
                scores.masked_fill_(~mask, fill)
            elif spelling == "where_number":
                scores = torch.where(mask, scores, fill)
            elif spelling == "where_tensor":
                scores = torch.where(mask, scores, torch.tensor(fill, dtype=scores.dtype))
            elif spelling == "additive":
                scores = scores + (~mask).to(scores.dtype) * fill
            else:
                scores[~mask] = float("-inf")
            if not to_softmax:
                return scores @ self.v(x)
            return self.out(scores.softmax(-1) @ self.v(x))

    torch.manual_seed(0)
    mask = torch.ones(2, 8, 8, dtype=torch.bool)
    mask[1, :, 5:] = False
    return Attention(), (torch.randn(2, 8, 16), mask)


def test_deberta_masked_fill_with_finfo_min_is_not_an_overflow():
    """HF DeBERTa's attention: ``attention_scores.masked_fill(~(attention_mask), torch.finfo(dtype).min)``
    (before the rule: 2 risky paths, amax 3.4e38, one per attention)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.DebertaConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.DebertaModel(config).eval()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[1, 8:] = 0  # padding: the masked_fill writes finfo.min into those lanes
    report = ampsafe.scan(model, (ids, attention_mask))
    assert _risky(report) == []
    attention = [p for p in report.paths if p.start.endswith("attention.self")]
    assert len(attention) == 2 and all(p.amax < 1e3 for p in attention)


# ------------------------------------------------------------------------------------------------------ Paddle
PADDLE_SPELLINGS = ("masked_fill", "masked_fill_tensor", "where_number", "where_tensor", "additive")


def _paddle_attention(spelling: str, to_softmax: bool = True):
    paddle = pytest.importorskip("paddle")
    import numpy as np

    class Attention(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (paddle.nn.Linear(16, 16) for _ in range(3))
            self.out = paddle.nn.Linear(16, 16)

        def forward(self, x, mask):
            scores = self.q(x) @ self.k(x).transpose([0, 2, 1]) / 4
            fill = float(np.finfo(np.float32).min)
            if spelling == "masked_fill":
                scores = paddle.masked_fill(scores, ~mask, fill)
            elif spelling == "masked_fill_tensor":
                scores = scores.masked_fill(~mask, paddle.to_tensor(fill))
            elif spelling == "where_number":
                scores = paddle.where(mask, scores, fill)
            elif spelling == "where_tensor":
                scores = paddle.where(mask, scores, paddle.full_like(scores, fill))
            else:
                scores = scores + (~mask).astype(scores.dtype) * fill
            if not to_softmax:
                return scores @ self.v(x)
            return self.out(paddle.nn.functional.softmax(scores, -1) @ self.v(x))

    paddle.seed(0)
    mask = np.ones((2, 8, 8), dtype=bool)
    mask[1, :, 5:] = False
    return Attention(), (paddle.randn([2, 8, 16]), paddle.to_tensor(mask))


# ------------------------------------------------------------------------------------------------------ both
BUILDERS = {"torch": _torch_attention, "paddle": _paddle_attention}


@pytest.mark.parametrize(
    "framework, spelling", [("torch", s) for s in SPELLINGS] + [("paddle", s) for s in PADDLE_SPELLINGS]
)
def test_mask_into_a_softmax_is_not_an_overflow(framework, spelling):
    model, inputs = BUILDERS[framework](spelling)
    report = ampsafe.scan(model, inputs)
    assert _risky(report) == []
    assert all(p.amax is not None and p.amax < 1e3 for p in report.paths)


@pytest.mark.parametrize("framework", BUILDERS)
@pytest.mark.parametrize("spelling", ["masked_fill", "where_number", "additive"])
def test_mask_lanes_that_reach_a_matmul_are_values(framework, spelling):
    model, inputs = BUILDERS[framework](spelling, to_softmax=False)
    risky = _risky(ampsafe.scan(model, inputs))
    assert risky and max(amax for _, amax in risky) > 1e38  # the fill value goes into a matmul: float16 overflows
