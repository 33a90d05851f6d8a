"""The shared training recipe of the trainer scripts: a layer that the model's own training drives past 65504.

A regression whose targets are in raw units of about 1e6 (the loss compares them in units of 1e5, as a user
normalizes a loss) learned by an unnormalized chain ``norm -> embed -> mid -> head`` (the BatchNorm only
normalizes the inputs) with Adam at lr 0.5. Every target is the same large number, so every gradient sign stays
the same until the output nears 1e6 and Adam moves each weight by about lr per step: the output grows like
``(step * lr) ** 3`` from 0 to 1e6, and ``head`` is the first layer whose output passes float16's 65504.

Measured in float32 (seeds 0-3, on an AVX-512 CPU and under ``ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2``): the
largest ``|head|`` output is 5.9e3-7.8e3 at step 2, 3.2e4-4.8e4 at step 3 (1.35x below 65504), 1.25e5-1.43e5
at step 4 (1.9x above), then about 1e6; ``mid``'s output stays under 1.6e4 (4x below), so ``head`` alone
overflows, first at step 4, with a margin of 1.35x either side: no CPU's float32 rounding moves that step. In a
float16 run the steps from 4 on overflow until the scaler reaches its floor and ampsafe heals.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES, WIDTH, BATCH = 16, 64, 8
TARGET, UNIT, LR = 1e6, 1e5, 0.5


def chain() -> nn.Sequential:
    """``norm`` (BatchNorm1d on the inputs: running buffers), then the unnormalized ``embed``, ``mid``, ``head``."""
    net = nn.Sequential()
    net.add_module("norm", nn.BatchNorm1d(FEATURES))
    net.add_module("embed", nn.Linear(FEATURES, WIDTH))
    net.add_module("mid", nn.Linear(WIDTH, WIDTH))
    net.add_module("head", nn.Linear(WIDTH, 1))
    return net


def data(steps: int, nan_step: int = -1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``BATCH * steps`` inputs and their targets (all ``TARGET``); one NaN input in the batch of ``nan_step``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH * steps, FEATURES, generator=g)
    if nan_step >= 0:
        x[BATCH * nan_step + 3, 2] = float("nan")
    return x, torch.full((BATCH * steps, 1), TARGET)


def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error in units of ``UNIT``, in float32 (the output may be float16 under autocast)."""
    return nn.functional.mse_loss(out.float() / UNIT, y.float() / UNIT)


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=LR)
