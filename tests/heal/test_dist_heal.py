"""Two CPU processes on loopback (gloo): only rank 1 overflows, yet both ranks island the same paths and agree."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.dist
def test_torch_ddp_ranks_heal_the_union_of_paths_and_stay_identical(tmp_path, free_port, worker_module):
    import torch
    import torch.multiprocessing as mp

    heal_workers = worker_module("heal_workers")
    mp.spawn(heal_workers.torch_worker, args=(2, free_port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"]
    assert "backbone.0" in r0["found"][0] and r0["patched"] == r1["patched"] and r0["patched"]
    assert all(torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
    assert r0["scale"] == r1["scale"]
    assert r0["stats_finite"] and r1["stats_finite"]  # rank 1's BatchNorm saw inf: the heal reset it


@pytest.mark.dist
def test_paddle_data_parallel_ranks_heal_the_union_of_paths_and_stay_identical(tmp_path):
    pytest.importorskip("paddle")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import heal_workers, paddle.distributed as dist;\n"
        "if __name__ == '__main__':\n"
        "    dist.spawn(heal_workers.paddle_worker, args=(sys.argv[2],), nprocs=2, backend='gloo')\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(HERE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (pickle.loads((tmp_path / f"{r}.pkl").read_bytes()) for r in (0, 1))
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"] and "0" in r0["found"][0]
    assert r0["patched"] == r1["patched"] and r0["patched"]
    assert all(np.array_equal(a, b) and np.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
    assert r0["scale"] == r1["scale"]
    assert r0["stats_finite"] and r1["stats_finite"]  # rank 1's BatchNorm saw inf: the heal reset it
