"""The shared recipe of the heal tests (scripts/growth.py) overflows through its own training, where it says."""

from __future__ import annotations

import torch
from trainer_helpers import float16_rerun_overflows, load_growth


def test_growth_recipe_overflows_float16_from_step_4_and_the_island_of_its_head_does_not():
    import ampsafe

    growth = load_growth()
    torch.manual_seed(0)
    assert float16_rerun_overflows(growth.chain())[:2] == [4, 5]  # torch's scaler skips: the weights stay grown
    torch.manual_seed(0)
    net = growth.chain()
    ampsafe.patch(net, policy="island", paths=["head"])
    assert float16_rerun_overflows(net) == []
