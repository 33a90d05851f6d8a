"""Paddle fleet, 2 gloo ranks on loopback: ``fleet.distributed_scaler`` outside pure data parallel assigns its own
``_unscale`` on the scaler; ampsafe's keeps its own (floor and heal), both ranks heal alike and stay identical.

Measured with paddlepaddle 3.3.1 on a CPU: sharding parallel (``sharding_degree`` 2) runs on gloo; tensor parallel
does not (``fleet.distributed_model`` asserts "Only support xpu, gpu and custom_device now, but this is cpu", and
without it ``ColumnParallelLinear`` fails: "Do not support c_identity for cpu kernel now"), so sharding is the
hybrid mode tested here."""

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
def test_fleet_distributed_scaler_under_sharding_keeps_the_floor_and_heal(tmp_path):
    pytest.importorskip("paddle")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import fleet_workers, paddle.distributed as dist;\n"
        "if __name__ == '__main__':\n"
        "    dist.spawn(fleet_workers.sharded_heal_worker, args=(sys.argv[2],), nprocs=2, backend='gloo')\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(HERE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (pickle.loads((tmp_path / f"{r}.pkl").read_bytes()) for r in (0, 1))
    for r in (r0, r1):
        assert r["beyond_dp"]  # the mode in which fleet replaces _unscale
        assert r["fleet_assigned"] and r["own_unscale"]  # fleet assigned its _unscale; the scaler's own answers
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"] and "0" in r0["found"][0]  # named in the model fleet wrapped
    assert r0["patched"] == r1["patched"] and r0["patched"]
    assert r0["skipped"] == r1["skipped"] >= 1 and r0["scale"] == r1["scale"]
    assert all(np.array_equal(a, b) and np.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
