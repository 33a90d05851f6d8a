"""Process body for the 2-rank Paddle fleet test: sharding parallel (``sharding_degree`` 2, gloo, CPU), the
hybrid mode in which ``fleet.distributed_scaler`` assigns its own ``_unscale`` on the scaler. Rank 1 alone gets
a batch that overflows float16 (emulated on this CPU) at its first conv."""

from __future__ import annotations

import os
import pickle

HOT_STEPS = 3


def sharded_heal_worker(out: str) -> None:
    import numpy as np
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet
    from paddle.distributed.fleet.base.topology import ParallelMode

    import ampsafe
    from ampsafe.paddle import GradScaler, emulate_fp16
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
