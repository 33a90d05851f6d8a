"""Process bodies for the 2-rank gloo heal tests: rank 1 alone gets a batch that overflows float16."""

from __future__ import annotations

import os

HOT_STEPS = 3  # rank 1's first steps carry inputs of 1e5 (> 65504): its first conv overflows, rank 0's does not


def torch_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ampsafe
    from ampsafe.torch import GradScaler
    from ampsafe_lab.workloads.heal_runs import fp16_step, grow_batch, grow_loss, grow_net

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(grow_net(0, channels=8, neck_convs=2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = GradScaler("cpu", init_scale=4.0, min_scale=1.0, on_floor="heal")
    healer = ampsafe.heal(model, scaler=scaler, target="cpu")
    for step in range(6):
        x, y = grow_batch(step, seed=rank, image_size=16, batch_size=4)
        if rank == 1 and step < HOT_STEPS:
            x = x * 1e5
        fp16_step(lambda: grow_loss(model(x), y), scaler, opt)  # noqa: B023 - called at once
    torch.save(
        {
            "params": [p.detach().clone() for p in model.parameters()],
            "stats_finite": all(bool(torch.isfinite(b).all()) for b in model.buffers()),
            "patched": ampsafe.patching.patched_modules(model),
            "heals": [(h.step, h.paths, h.scale_after) for h in scaler.stats.heals],
            "found": [list(h.found) for h in healer.heals],
            "scale": scaler.get_scale(),
        },
        os.path.join(out, f"{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()


def paddle_worker(out: str) -> None:
    import pickle

    import numpy as np
    import paddle
    import paddle.distributed as dist

    import ampsafe
    from ampsafe.paddle import GradScaler

    dist.init_parallel_env()
    rank = dist.get_rank()
    paddle.seed(0)
    nn = paddle.nn
    layer = nn.Sequential(
        nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8), nn.ReLU(), nn.Conv2D(8, 8, 3, padding=1), nn.Conv2D(8, 1, 1)
    )
    model = paddle.DataParallel(layer)
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=4.0, min_loss_scaling=1.0, on_floor="heal", emulated=True)
    healer = ampsafe.heal(model, scaler=scaler)
    _paddle_hot_steps(model, layer, opt, scaler, rank)
    record = {
        "params": [p.numpy() for p in layer.parameters() if not p.stop_gradient],
        "stats_finite": all(np.isfinite(p.numpy()).all() for p in layer.parameters() if p.stop_gradient),
        "patched": ampsafe.patching.patched_modules(layer),
        "heals": [(h.step, h.paths, h.scale_after) for h in scaler.stats.heals],
        "found": [list(h.found) for h in healer.heals],
        "scale": scaler.get_loss_scaling(),
    }
    with open(os.path.join(out, f"{rank}.pkl"), "wb") as fh:
        pickle.dump(record, fh)


def _paddle_hot_steps(model, layer, opt, scaler, rank: int) -> None:
    """Six float16 steps (emulated on this CPU); rank 1's first ``HOT_STEPS`` batches overflow the first conv."""
    import numpy as np
    import paddle

    from ampsafe.paddle import emulate_fp16

    rng = np.random.default_rng(100 + rank)
    with emulate_fp16(layer):
        for step in range(6):
            x = rng.standard_normal((4, 3, 16, 16)).astype("float32")
            if rank == 1 and step < HOT_STEPS:
                x = x * 1e5
            loss = model(paddle.to_tensor(x)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()


def paddle_fleet_worker(out: str) -> None:
    """As :func:`paddle_worker` under Paddle fleet's sharding parallel (``sharding_degree`` 2): the hybrid mode in
    which ``fleet.distributed_scaler`` assigns its own ``_unscale`` on the scaler."""
    import pickle

    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet
    from paddle.distributed.fleet.base.topology import ParallelMode

    import ampsafe
    from ampsafe.paddle import GradScaler
    from ampsafe.paddle.fleet import assigned

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 2}
    fleet.init(is_collective=True, strategy=strategy)
    rank = dist.get_rank()
    paddle.seed(0)
    nn = paddle.nn
    layer = nn.Sequential(nn.Conv2D(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2D(8, 8, 3, padding=1), nn.Conv2D(8, 1, 1))
    model = fleet.distributed_model(layer)
    opt = fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=1e-3, parameters=layer.parameters()))
    scaler = GradScaler(init_loss_scaling=4.0, min_loss_scaling=1.0, on_floor="heal", emulated=True)
    scaler = fleet.distributed_scaler(scaler)
    record = {
        "beyond_dp": fleet.get_hybrid_communicate_group().get_parallel_mode() != ParallelMode.DATA_PARALLEL,
        "fleet_assigned": assigned(scaler, "_unscale") is not None,
        "own_unscale": scaler._unscale.__func__ is type(scaler)._unscale,
    }
    healer = ampsafe.heal(model, scaler=scaler)
    _paddle_hot_steps(model, layer, opt, scaler, rank)
    record.update(
        params=[p.numpy() for p in layer.parameters()],
        patched=ampsafe.patching.patched_modules(layer),
        heals=[(h.step, h.paths, h.scale_after) for h in scaler.stats.heals],
        found=[list(h.found) for h in healer.heals],
        skipped=scaler.stats.skipped_steps,
        scale=scaler.get_loss_scaling(),
    )
    with open(os.path.join(out, f"{rank}.pkl"), "wb") as fh:
        pickle.dump(record, fh)


def torch_bare_worker(rank: int, world: int, port: int, out: str) -> None:
    """As :func:`torch_worker`, with a bare ``GradScaler(on_floor="heal")``: no ``ampsafe.heal``, no ``model=``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ampsafe
    from ampsafe.torch import GradScaler
    from ampsafe_lab.workloads.heal_runs import fp16_step, grow_batch, grow_loss, grow_net

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(grow_net(0, channels=8, neck_convs=2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = GradScaler("cpu", init_scale=4.0, min_scale=1.0, on_floor="heal")
    for step in range(6):
        x, y = grow_batch(step, seed=rank, image_size=16, batch_size=4)
        if rank == 1 and step < HOT_STEPS:
            x = x * 1e5
        fp16_step(lambda: grow_loss(model(x), y), scaler, opt)  # noqa: B023 - called at once
    torch.save(
        {
            "params": [p.detach().clone() for p in model.parameters()],
            "patched": ampsafe.patching.patched_modules(model),
            "heals": [(h.step, h.paths, h.scale_after) for h in scaler.stats.heals],
            "found": [list(h.found) for h in scaler._healer.heals] if scaler._healer is not None else [],
            "resolved_is_inner": scaler.model is model.module,
            "scale": scaler.get_scale(),
        },
        os.path.join(out, f"{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()
