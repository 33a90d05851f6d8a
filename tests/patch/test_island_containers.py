"""Which modules policy ``island`` islands for a risky path that runs through a container's own forward.

SVTRNet's forward reshapes/transposes the stream between ``blocks2`` and ``sub_sample2``, so ``backbone`` is a
layer of the stage-2 paths; islanding it whole ran the entire backbone in float32 where its stage-2 members do.
A container is islanded whole only when an op of the path in its own forward computes in float16 at the level
(here a matmul); an op that only moves data does not make it one. The heal, ``patch(policy="island",
paths=report.paths)`` and ``ampsafe run``'s backoff scan read the same rule (``policies.island``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ampsafe
from ampsafe._framework import backend_of
from ampsafe.healing.healer import Healer
from ampsafe.policies.island import island_modules

BIG = 2e4  # the first linear's output reaches ~1e5 > 65504 on the inputs below


class Moves(nn.Module):
    """A container whose own forward only moves the stream (transpose + reshape) between its two children."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Linear(4, 4)
        self.merge = nn.Linear(16, 4)

    def forward(self, x):
        h = self.blocks(x)  # (B, 4, 4)
        return self.merge(h.transpose(1, 2).reshape(x.shape[0], 16))


class Computes(nn.Module):
    """A container whose own forward runs a matmul on the path, between its child and its output."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.full((4, 4), 0.25))

    def forward(self, x):
        h = self.blocks(x).transpose(1, 2)
        return torch.matmul(h, self.w).flatten(1)


class Net(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = nn.LayerNorm(backbone_width(backbone))

    def forward(self, x):
        return self.head(self.backbone(x))


def backbone_width(backbone: nn.Module) -> int:
    return 4 if isinstance(backbone, Moves) else 16


def make(backbone_cls) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Net(backbone_cls())
    with torch.no_grad():
        model.backbone.blocks.weight.fill_(BIG)  # 4 inputs of ~1.3 each: ~1e5
        model.backbone.blocks.bias.zero_()
    return model, torch.full((2, 4, 4), 1.3)


def risky(model, x, level):
    report = ampsafe.scan(model, (x,), level=level, target="cpu")
    paths = [p for p in report.paths if p.risky]
    assert any(p.start == "backbone.blocks" for p in paths), report.to_markdown()
    return paths


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_container_that_only_moves_data_is_not_islanded_its_members_on_the_path_are(level):
    model, x = make(Moves)
    paths = risky(model, x, level)
    on_path = next(p for p in paths if p.start == "backbone.blocks")
    assert "backbone" in on_path.layers  # the transpose/reshape run in the container's own forward
    patched = ampsafe.patch(model, policy="island", level=level, paths=paths)
    islanded = ampsafe.patching.patched_modules(model)
    assert set(patched.patched) == set(islanded) and "backbone" not in islanded, islanded
    assert {"backbone.blocks", "backbone.merge"} <= set(islanded) <= {"backbone.blocks", "backbone.merge", "head"}


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_container_whose_own_forward_runs_a_matmul_on_the_path_is_islanded_whole(level):
    model, x = make(Computes)
    paths = risky(model, x, level)
    on_path = next(p for p in paths if p.start == "backbone.blocks")
    assert "backbone" in island_modules(on_path, level, backend_of(model))
    ampsafe.patch(model, policy="island", level=level, paths=paths)
    islanded = ampsafe.patching.patched_modules(model)
    assert "backbone" in islanded and not any(m.startswith("backbone.") for m in islanded), islanded


def test_heal_islands_the_members_not_the_data_moving_container():
    model, x = make(Moves)
    healer = Healer(model, backend=backend_of(model), level="O2", target="cpu")
    model(x)  # the batch the heal replays
    plan = healer()
    assert "backbone" not in plan.paths and {"backbone.blocks", "backbone.merge"} <= set(plan.paths), plan


@pytest.mark.parametrize("backbone_cls", [Moves, Computes])
def test_run_backoff_scan_names_the_modules_the_island_of_its_paths_patches(backbone_cls):
    from types import SimpleNamespace

    from ampsafe.core.capture import InputCapture
    from ampsafe.run.tracked import backoff_scan

    model, x = make(backbone_cls)
    backend = backend_of(model)
    scaler = SimpleNamespace(model=model, capture=InputCapture(backend, model), _backend=lambda: backend)
    model(x)  # the step's batch, as the scaler's capture holds it during update()
    scan = backoff_scan(scaler, step=2)
    assert "backbone.blocks" in scan.paths, scan
    if backbone_cls is Moves:
        assert {"backbone.blocks", "backbone.merge"} <= set(scan.modules) and "backbone" not in scan.modules
    else:
        assert "backbone" in scan.modules and not any(m.startswith("backbone.") for m in scan.modules)
    risky = [p for p in ampsafe.scan(model, (x,)).paths if p.risky]
    ampsafe.patch(model, policy="island", paths=risky)  # what the heal does with the same paths
    assert set(ampsafe.patching.patched_modules(model)) == set(scan.modules)
