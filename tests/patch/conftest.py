"""Fixtures of the patch tests: deterministic inputs for the small models in ``patch_models``."""

from __future__ import annotations

import pytest


@pytest.fixture
def torch_input():
    import torch

    return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def paddle_input():
    import numpy as np
    import paddle

    return paddle.to_tensor(np.random.default_rng(1).standard_normal((4, 3, 16, 16)).astype("float32"))
