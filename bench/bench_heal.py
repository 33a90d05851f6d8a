"""Self-healing: throughput after ``ampsafe.heal`` islanded the overflowing paths vs the same paths islanded up front.

Two runs per model, same seed and batches: (a) unpatched with ``GradScaler(on_floor="heal")`` + ``ampsafe.heal``
until it has healed, then timed; (b) patched with ``policy="island"`` for exactly the healed paths, then timed.
A heal is a class swap like ``patch``, so (a) should be as fast as (b). Models: ``dbnet`` under
``ampsafe.paddle.emulate_fp16`` (EMULATED float16: every op runs in float32 on the CPU, so the absolute speed
says nothing about a GPU) and ``GrowNet`` (below) under real CPU float16 autocast.

``GrowNet`` is the torch analogue of DBNet's failure: a BatchNorm backbone, an unnormalized residual chain of
3x3 convs (the "neck") and a head whose first conv is followed by BatchNorm, so nothing bounds its output.
Under Adam at a high learning rate the chain's weights grow together and ``head.conv1`` leaves float16's range
after a few steps while float32 training is healthy.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_result  # noqa: E402

TORCH_RECIPE = {"channels": 16, "neck_convs": 4, "image_size": 32, "batch_size": 8, "lr": 5e-2, "init_scale": 1024.0}


def grow_net(seed: int = 0, channels: int = 16, neck_convs: int = 4):
    """The GrowNet module (see the module docstring), deterministic for ``seed``."""
    import torch
    from torch import nn

    class GrowNet(nn.Module):
        def __init__(self):
            super().__init__()
            c = channels
            self.backbone = nn.Sequential(
                nn.Conv2d(3, c, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
            )
            self.neck = nn.ModuleDict({f"conv{i}": nn.Conv2d(c, c, 3, 1, 1, bias=False) for i in range(neck_convs)})
            self.head = nn.ModuleDict(
                {"conv1": nn.Conv2d(c, c, 3, 1, 1, bias=False), "bn": nn.BatchNorm2d(c), "conv2": nn.Conv2d(c, 1, 1)}
            )

        def forward(self, x):
            f = self.backbone(x)
            for conv in self.neck.values():
                f = conv(f) + f
            return self.head["conv2"](torch.relu(self.head["bn"](self.head["conv1"](f))))

    torch.manual_seed(seed)
    return GrowNet()


def grow_batch(step: int, seed: int = 0, image_size: int = 32, batch_size: int = 8):
    """(images, target map) for ``step``: the target is where the image is brighter than average."""
    import torch

    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    y = (x.mean(1, keepdim=True)[:, :, ::2, ::2] > 0).float()
    return x, y


def grow_loss(out, y):
    import torch

    return torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y)


def train_grow(
    mode: str,
    *,
    steps: int,
    seed: int = 0,
    paths=None,
    max_heals: int = 3,
    patience: int | None = None,
    recipe: dict | None = None,
    batch_hook=None,
):
    """Train GrowNet under CPU float16 autocast; returns a dict (losses, scales, overflowed, model, scaler, ...).

    ``mode``: "heal" (unpatched, ``on_floor="heal"`` + ``ampsafe.heal``), "island" (``patch(policy="island")`` on
    ``paths`` or, without, on what scan finds), "fp32" (no autocast). ``batch_hook(step, x, model) -> x`` alters a batch (or the model).
    """
    import torch

    import ampsafe
    from ampsafe.torch import GradScaler

    r = {**TORCH_RECIPE, **(recipe or {})}
    model = grow_net(seed, r["channels"], r["neck_convs"])
    example = (grow_batch(0, seed, r["image_size"], r["batch_size"])[0],)
    healer = None
    if mode == "island":
        if paths is None:
            report = ampsafe.scan(model, example, target="cpu")
            ampsafe.patch(model, policy="island", report=report)
        else:
            ampsafe.patch(model, policy="island", paths=list(paths))
    opt = torch.optim.Adam(model.parameters(), lr=r["lr"])
    scaler = GradScaler("cpu", init_scale=r["init_scale"], min_scale=1.0, on_floor="heal", enabled=mode != "fp32")
    if mode == "heal":
        healer = ampsafe.heal(model, scaler=scaler, target="cpu", max_heals=max_heals, patience=patience)
    out = {"losses": [], "scales": [], "overflowed": [], "model": model, "scaler": scaler, "healer": healer}
    for step in range(steps):
        x, y = grow_batch(step, seed, r["image_size"], r["batch_size"])
        if batch_hook is not None:
            x = batch_hook(step, x, model)
        scale = scaler.get_scale()
        skipped = scaler.stats.skipped_steps
        with torch.autocast("cpu", dtype=torch.float16, enabled=mode != "fp32"):
            loss = grow_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        out["losses"].append(float(loss.detach()))
        out["scales"].append(float(scale))
        out["overflowed"].append(scaler.stats.skipped_steps > skipped)
    return out


def run(suite: str = "quick") -> dict:
    raise NotImplementedError


if __name__ == "__main__":
    run()
