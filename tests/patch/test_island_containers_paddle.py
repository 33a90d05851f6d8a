"""Paddle's side of ``test_island_containers``: SVTRNet's case at O2, where the heal islanded the whole backbone.

A container whose own forward only transposes/reshapes the stream between two sublayers on an overflowing path
is not islanded (its sublayers on the path are); one whose own forward runs a matmul on the path is.
"""

from __future__ import annotations

import paddle
import pytest
from paddle import nn

import ampsafe
from ampsafe.patching import patched_modules

BIG = 2e4  # the first linear's output reaches ~1e5 > 65504 on the inputs below


class Moves(nn.Layer):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Linear(4, 4)
        self.merge = nn.Linear(16, 4)

    def forward(self, x):
        h = self.blocks(x)  # [B, 4, 4]
        return self.merge(h.transpose([0, 2, 1]).reshape([x.shape[0], 16]))


class Computes(nn.Layer):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Linear(4, 4)
        self.w = self.create_parameter([4, 4], default_initializer=nn.initializer.Constant(0.25))

    def forward(self, x):
        h = self.blocks(x).transpose([0, 2, 1])
        return paddle.matmul(h, self.w).flatten(1)


class Net(nn.Layer):
    def __init__(self, backbone, width):
        super().__init__()
        self.backbone = backbone
        self.head = nn.LayerNorm(width)

    def forward(self, x):
        return self.head(self.backbone(x))


def make(backbone_cls, width):
    paddle.seed(0)
    model = Net(backbone_cls(), width)
    with paddle.no_grad():
        model.backbone.blocks.weight.set_value(paddle.full([4, 4], BIG))
        model.backbone.blocks.bias.set_value(paddle.zeros([4]))
    return model, paddle.full([2, 4, 4], 1.3)


@pytest.mark.parametrize(("backbone_cls", "width", "whole"), [(Moves, 4, False), (Computes, 16, True)])
def test_o2_island_of_the_scanned_paths_takes_a_container_whole_only_for_its_own_matmul(backbone_cls, width, whole):
    model, x = make(backbone_cls, width)
    report = ampsafe.scan(model, (x,), level="O2")
    paths = [p for p in report.paths if p.risky]
    on_path = next(p for p in paths if p.start == "backbone.blocks")
    assert "backbone" in on_path.layers  # an op of the path runs in the container's own forward
    ampsafe.patch(model, policy="island", level="O2", paths=paths)
    islanded = patched_modules(model)
    if whole:
        assert "backbone" in islanded and not any(m.startswith("backbone.") for m in islanded), islanded
    else:
        assert "backbone" not in islanded and {"backbone.blocks", "backbone.merge"} <= set(islanded), islanded
