"""Process bodies for the 2-rank FSDP2 pure-float16 runs of the llama brink (``ampsafe_lab.workloads.llama_brink``,
gloo, CPU): each decoder layer and the model ``fully_shard``-ed with ``param_dtype=torch.float16``."""

from __future__ import annotations

import os

STEPS = 6
INIT_SCALE = 4.0  # two halvings to the floor (min_scale 1)


def _shard(model, mesh, dtype, per_layer: bool) -> None:
    """The user's sharding: each decoder layer (``per_layer``), then the model; a layer a printed fix line already
    sharded keeps that line's policy (the line replaces the user's call of it)."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers if per_layer else ():
        if not isinstance(layer, FSDPModule):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def brink_worker(rank: int, world: int, port: int, out: str, modes: tuple) -> None:
    """For each of ``modes``, from the brink, ``STEPS`` steps under ampsafe's scaler with ``on_floor="heal"``: what
    the scaler did each step, its heals, and the error that ended the run (if one did), saved as
    ``<out>/<mode><rank>.pt``. "pure": FSDP2 ``param_dtype`` float16, each decoder layer and the model sharded;
    "pure_fix": as "pure", the ``fully_shard`` lines its heal printed in place of the calls of those layers (and
    before the model's); "root": the same, the model alone sharded; "fix": as "root", after the ``fully_shard``
    lines the "root" heal printed; "autocast": ``param_dtype`` float32 per layer, the forward under
    ``torch.autocast("cpu", torch.float16)`` (measured: its heal's scan raised "aten.mm.default got mixed
    torch.Tensor and DTensor"; not tested)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    fixes = {}
    for mode in modes:
        fix = fixes.get({"fix": "root", "pure_fix": "pure"}.get(mode), "")
        record = _run(mode, mesh, rank, world, fix)
        fixes[mode] = record["fix"].get("torch_fsdp2", ("", ""))[0]
        torch.save(record, os.path.join(out, f"{mode}{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _run(mode: str, mesh, rank: int, world: int, fix: str) -> dict:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ampsafe.torch import GradScaler
    from ampsafe_lab.workloads import llama_brink

    workload, _, first = llama_brink.brink_start(0)
    model = workload.model
    names = {"fully_shard": lambda m, **kw: fully_shard(m, mesh=mesh, **kw), "torch": torch}
    for line in fix.splitlines():
        exec(line, {**names, "MixedPrecisionPolicy": MixedPrecisionPolicy, "model": model})  # the printed line
    per_layer = mode not in ("root", "fix")
    _shard(model, mesh, torch.float32 if mode == "autocast" else torch.float16, per_layer=per_layer)
    amp = torch.autocast("cpu", dtype=torch.float16, enabled=mode == "autocast")
    opt = torch.optim.Adam(model.parameters(), lr=llama_brink.RECIPE["lr"])
    scaler = GradScaler("cpu", init_scale=INIT_SCALE, min_scale=1.0, on_floor="heal")
    record = {"skipped": [], "losses": [], "error": None}
    try:
        for step in range(STEPS):
            batch = workload.batch(first + step * world + rank)
            opt.zero_grad()
            with amp:
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < before:
                record["skipped"].append(step)
            record["losses"].append(float(loss.detach()))
    except Exception as exc:  # noqa: BLE001 - the test reads what ended the run
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["heals"] = [(h.step, h.paths) for h in scaler.stats.heals]
    record["fix"] = scaler.fix_lines([p for h in scaler.stats.heals for p in h.paths])  # the report's lines
    record["params"] = {n: _full(p) for n, p in model.named_parameters()}
    return record


def _full(param):
    """The whole parameter (a DTensor's gathered shards), detached."""
    return (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()
