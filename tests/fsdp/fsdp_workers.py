"""Process bodies for the 2-rank FSDP2 pure-float16 tests (gloo, CPU): the regression of issue 33 whose last
layer's float16 output passes 65504 by training (three ``nn.Linear``, a target of 1e6, AdamW lr 0.5)."""

from __future__ import annotations

import os

TARGET = 1e6
LR = 1.0
STEPS = 14
INIT_SCALE = 4.0  # two halvings to the floor (min_scale 1)


def _net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def regress_worker(rank: int, world: int, port: int, out: str) -> None:
    """The regression three times: "native" (torch's GradScaler), "heal" (ampsafe's, ``on_floor="heal"``), "fix"
    (the ``fully_shard`` lines the heal printed, run before the model's own, with ampsafe's scaler)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    names = {"fully_shard": lambda m, **kw: fully_shard(m, mesh=mesh, **kw), "torch": torch}
    names["MixedPrecisionPolicy"] = MixedPrecisionPolicy
    records = {}
    for mode in ("native", "heal", "fix"):
        model = _net()
        fix = records.get("heal", {}).get("fix", {}).get("torch_fsdp2", ("", ""))[0] if mode == "fix" else ""
        for line in fix.splitlines():
            exec(line, {**names, "model": model})  # the printed line, run on the user's model
        policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        records[mode] = _train(model, mode, rank)
    torch.save(records, os.path.join(out, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _train(model, mode: str, rank: int) -> dict:
    import torch

    from ampsafe.torch import GradScaler

    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if mode == "native":
        scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    else:
        scaler = GradScaler("cpu", init_scale=INIT_SCALE, min_scale=1.0, on_floor="heal")
    gen = torch.Generator().manual_seed(100 + rank)
    skipped, outputs = [], []
    for step in range(STEPS):
        x = torch.rand(16, 8, generator=gen)
        opt.zero_grad()
        y = model(x)
        loss = ((y.float() - TARGET) / TARGET).pow(2).mean()  # relative: finite while y is
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < before:
            skipped.append(step)
        outputs.append(float(y.detach().float().abs().max()))
    record = {
        "params": [p.full_tensor().detach().clone() for p in model.parameters()],
        "skipped": skipped,
        "outputs": outputs,
        "scale": scaler.get_scale(),
        "dtype": str(y.dtype),
    }
    if mode != "native":
        heals = scaler.stats.heals
        paths = [p for h in heals for p in h.paths]
        record.update(heals=[(h.step, h.paths) for h in heals], fix=scaler.fix_lines(paths))  # the report's lines
    return record


def _sharded_hot_net(world: int):
    """The regression net, its last Linear scaled so that its float16 output passes 65504 at once, sharded in pure
    float16 (and the process group up)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = _net()
    with torch.no_grad():
        model[4].weight.mul_(1e6)
    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)), mp_policy=policy)
    return model


def _batch(rank: int, step: int, bad_rank: int):
    """Rank ``rank``'s batch of ``step``; on ``bad_rank`` its sample 3 holds a NaN."""
    import torch

    x = torch.rand(16, 8, generator=torch.Generator().manual_seed(100 * step + rank))
    if rank == bad_rank:
        x[3, 0] = float("nan")
    return x


def split_evidence_worker(rank: int, world: int, port: int, out: str) -> None:
    """Ranks that see different evidence: rank 0's batch overflows in the forward, rank 1's holds a NaN sample.

    "heal": ``ampsafe.heal(model, batch_fn)`` on each rank's batch, the error each rank raised. Then a scaler with
    ``on_floor="heal"`` one halving above its floor: a step where both overflow (to the floor), two on those
    batches, one where both overflow again: each rank's scales, the steps it counted as data, its heals."""
    import torch
    import torch.distributed as dist

    import ampsafe
    from ampsafe.torch import GradScaler

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    record = {}
    model = _sharded_hot_net(world)
    try:
        ampsafe.heal(model, lambda: (_batch(rank, 0, bad_rank=1),))
        record["heal"] = None
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
        record["heal"] = f"{type(exc).__name__}: {exc}"
    model = _sharded_hot_net(world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = GradScaler("cpu", init_scale=2.0, min_scale=1.0, on_floor="heal")
    record["scales"], record["heals"] = [], []
    for step, bad_rank in enumerate((-1, 1, 1, -1)):
        opt.zero_grad()
        y = model(_batch(rank, step, bad_rank))
        scaler.scale(((y.float() - TARGET) / TARGET).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        record["scales"].append(scaler.get_scale())
    record["input_steps"] = scaler.stats.input_steps
    record["heals"] = [(h.step, h.paths) for h in scaler.stats.heals]
    record["params"] = [p.full_tensor().detach().clone() for p in model.parameters()]
    torch.save(record, os.path.join(out, f"{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
