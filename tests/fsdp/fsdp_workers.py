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
