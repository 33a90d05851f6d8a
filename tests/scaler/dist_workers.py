"""Process bodies for the 2-rank gloo tests (kept apart from the test module so spawned children import little)."""

from __future__ import annotations

import math
import os


def _tiny_torch(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def torch_ddp_worker(rank: int, world: int, port: int, out: str, poison_steps: tuple, fsdp: bool) -> None:
    """Train the same model with ampsafe's and torch's scalers; rank 1 alone gets an inf gradient."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ampsafe.torch import GradScaler

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    makers = {
        "ampsafe": lambda: GradScaler("cpu", init_scale=256.0, growth_interval=2),
        "torch": lambda: torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2),
    }
    results = {}
    for name, make in makers.items():
        model = DDP(_tiny_torch(0))
        results[name] = _torch_train(model, make(), rank, poison_steps, lambda m: m.module[2].weight)
    if fsdp:
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard  # FSDP2: FSDP1 refuses to run without an accelerator

            model = fully_shard(_tiny_torch(0), mesh=init_device_mesh("cpu", (world,)))
            results["fsdp"] = _torch_train(model, makers["ampsafe"](), rank, poison_steps, _first_local_param)
        except Exception as exc:  # recorded, the test reports it
            results["fsdp_error"] = f"{type(exc).__name__}: {exc}"
    torch.save(results, os.path.join(out, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class _LocalShard:
    def __init__(self, local):
        self.grad = local


def _first_local_param(model):
    """The first parameter whose shard on this rank is not empty, seen as a plain tensor (its local shard)."""
    for p in model.parameters():
        local = p.grad.to_local()
        if local.numel() > 0:
            return _LocalShard(local)
    raise AssertionError("no local shard")


def _plain(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _torch_train(model, scaler, rank, poison_steps, target):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(6):
        opt.zero_grad()
        loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
        scaler.scale(loss).backward()
        if rank == 1 and step in poison_steps:
            target(model).grad.view(-1)[0] = math.inf
        scaler.step(opt)
        scaler.update()
    stats = getattr(scaler, "stats", None)
    return {
        "params": [_plain(p).detach().clone() for p in model.parameters()],
        "scale": scaler.get_scale(),
        "skipped": stats.skipped_steps if stats else None,
    }


def paddle_dp_worker(out: str, poison_steps: tuple) -> None:
    """paddle.DataParallel on gloo: ampsafe's scaler; rank 1 alone gets an inf gradient."""
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from ampsafe.paddle import GradScaler

    dist.init_parallel_env()
    rank = dist.get_rank()
    paddle.seed(0)
    layer = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    model = paddle.DataParallel(layer)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=256.0, incr_every_n_steps=2, emulated=True)  # scale on this CPU
    rng = np.random.default_rng(100 + rank)
    for step in range(6):
        loss = model(paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))).pow(2).mean()
        scaler.scale(loss).backward()
        if rank == 1 and step in poison_steps:
            grad = layer[2].weight._grad_ivar()
            arr = grad.numpy()
            arr.reshape(-1)[0] = np.inf
            grad.set_value(arr)
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
    np.savez(
        os.path.join(out, f"{rank}.npz"),
        *[p.numpy() for p in layer.parameters()],
        scale=np.float32(scaler.get_loss_scaling()),
        skipped=np.int64(scaler.stats.skipped_steps),
    )
