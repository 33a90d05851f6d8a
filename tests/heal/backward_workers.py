"""Spawned workers of tests/heal/test_backward_floor.py (2 gloo ranks on loopback)."""

from __future__ import annotations

import os


def torch_critic_worker(rank: int, world: int, port: int, out: str) -> None:
    """The critic of scripts/train_critic.py (its model class) under DDP with a bare ``GradScaler("cpu", on_floor="heal")``, each
    rank its own tokens and returns: its value head's gradient overflows float16 in the backward alone."""
    import torch
    import torch.distributed as dist
    from scripts.train_critic import Critic
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ampsafe.torch import GradScaler

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(0)
    model = DDP(Critic())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler("cpu", init_scale=8.0, min_scale=1.0, on_floor="heal")
    origins: list = []
    scaler.add_step_callback(
        lambda d: origins.append((d.step, d.grad_origin.module, d.grad_origin.kind)) if d.grad_origin else None
    )
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(10):
        tokens = torch.randint(0, 100, (1, 512), generator=data)
        returns = 100 + torch.randn(1, 512, generator=data)
        with torch.autocast("cpu", dtype=torch.float16):
            values = model(tokens)
        loss = ((values.float() - returns) ** 2).sum()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(float(loss.detach()))
    torch.save(
        {
            "origins": origins,
            "heals": [(h.step, h.paths, h.verdict.where if h.verdict else None) for h in scaler.stats.heals],
            "below_floor": [(b.step, b.scale) for b in scaler.stats.below_floor],
            "params": [p.detach().clone() for p in model.parameters()],
            "scale": scaler.get_scale(),
            "losses": losses,
        },
        os.path.join(out, f"{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()
