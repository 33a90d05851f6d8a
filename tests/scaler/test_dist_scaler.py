"""Two CPU processes on loopback (gloo): found_inf is agreed across ranks, so all ranks skip the same steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
POISON = (2,)


@pytest.mark.dist
def test_torch_ddp_ranks_skip_together_where_torchs_own_scaler_diverges(tmp_path, free_port, worker_module):
    import torch
    import torch.multiprocessing as mp

    dist_workers = worker_module("dist_workers")
    mp.spawn(dist_workers.torch_ddp_worker, args=(2, free_port, str(tmp_path), POISON, True), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    ours = [torch.equal(a, b) for a, b in zip(r0["ampsafe"]["params"], r1["ampsafe"]["params"])]
    assert all(ours) and r0["ampsafe"]["skipped"] == r1["ampsafe"]["skipped"] == len(POISON)
    assert r0["ampsafe"]["scale"] == r1["ampsafe"]["scale"]
    theirs = [torch.equal(a, b) for a, b in zip(r0["torch"]["params"], r1["torch"]["params"])]
    assert not all(theirs)  # torch's own: only rank 1 skipped, the replicas now differ
    assert r0["torch"]["scale"] != r1["torch"]["scale"]
    # FSDP2 (fully_shard, gloo, CPU): the shard on rank 1 overflows, both ranks skip, the gathered params agree
    assert "fsdp_error" not in r0, r0.get("fsdp_error")
    assert r0["fsdp"]["skipped"] == r1["fsdp"]["skipped"] == len(POISON)
    assert all(
        torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0["fsdp"]["params"], r1["fsdp"]["params"])
    )


@pytest.mark.dist
def test_paddle_data_parallel_ranks_skip_together(tmp_path):
    pytest.importorskip("paddle")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import dist_workers, paddle.distributed as dist;\n"
        "if __name__ == '__main__':\n"
        "    dist.spawn(dist_workers.paddle_dp_worker, args=(sys.argv[2], (2,)), nprocs=2, backend='gloo')\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(HERE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (np.load(tmp_path / f"{r}.npz") for r in (0, 1))
    params = [k for k in r0.files if k.startswith("arr_")]
    assert params and all(np.array_equal(r0[k], r1[k]) for k in params)
    assert int(r0["skipped"]) == int(r1["skipped"]) == len(POISON) and float(r0["scale"]) == float(r1["scale"])
