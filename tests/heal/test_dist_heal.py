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


def _paddle_ranks(worker: str, tmp_path) -> tuple[dict, dict]:
    """``heal_workers.<worker>(tmp_path)`` on 2 gloo ranks (``paddle.distributed.spawn``); each rank's record."""
    pytest.importorskip("paddle")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import heal_workers, paddle.distributed as dist;\n"
        "if __name__ == '__main__':\n"
        f"    dist.spawn(heal_workers.{worker}, args=(sys.argv[2],), nprocs=2, backend='gloo')\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(HERE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (pickle.loads((tmp_path / f"{r}.pkl").read_bytes()) for r in (0, 1))
    return r0, r1


@pytest.mark.dist
def test_paddle_data_parallel_ranks_heal_the_union_of_paths_and_stay_identical(tmp_path):
    r0, r1 = _paddle_ranks("paddle_worker", tmp_path)
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"] and "0" in r0["found"][0]
    assert r0["patched"] == r1["patched"] and r0["patched"]
    assert all(np.array_equal(a, b) and np.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
    assert r0["scale"] == r1["scale"]
    assert r0["stats_finite"] and r1["stats_finite"]  # rank 1's BatchNorm saw inf: the heal reset it


@pytest.mark.dist
def test_paddle_fleet_distributed_scaler_under_sharding_keeps_the_floor_and_heal(tmp_path):
    """``fleet.distributed_scaler`` outside pure data parallel assigns its own ``_unscale`` on the scaler; ampsafe's
    keeps its own (floor and heal), and both ranks heal alike and stay identical.

    Measured with paddlepaddle 3.3.1 on a CPU: sharding parallel (``sharding_degree`` 2) runs on gloo; tensor
    parallel does not (``fleet.distributed_model`` asserts "Only support xpu, gpu and custom_device now, but this is
    cpu", and without it ``ColumnParallelLinear`` fails: "Do not support c_identity for cpu kernel now")."""
    r0, r1 = _paddle_ranks("paddle_fleet_worker", tmp_path)
    for r in (r0, r1):
        assert r["beyond_dp"]  # the mode in which fleet replaces _unscale
        assert r["fleet_assigned"] and r["own_unscale"]  # fleet assigned its _unscale; the scaler's own answers
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"] and "0" in r0["found"][0]  # named in the model fleet wrapped
    assert r0["patched"] == r1["patched"] and r0["patched"]
    assert r0["skipped"] == r1["skipped"] >= 1 and r0["scale"] == r1["scale"]
    assert all(np.array_equal(a, b) and np.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
