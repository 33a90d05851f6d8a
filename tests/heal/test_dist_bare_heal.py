"""Two CPU processes on loopback (gloo) with a bare GradScaler(on_floor="heal") (no ampsafe.heal, no model=):
only rank 1 overflows, yet both ranks resolve the same model, island the same paths and stay identical."""

from __future__ import annotations

import pytest


@pytest.mark.dist
def test_torch_ddp_bare_heal_scalers_island_the_same_paths_and_stay_identical(tmp_path, free_port, worker_module):
    import torch
    import torch.multiprocessing as mp

    heal_workers = worker_module("heal_workers")
    mp.spawn(heal_workers.torch_bare_worker, args=(2, free_port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["resolved_is_inner"] and r1["resolved_is_inner"]  # the model inside DDP, on both ranks
    assert len(r0["heals"]) == 1 and r0["heals"] == r1["heals"]
    assert r0["found"] == r1["found"] and "backbone.0" in r0["found"][0]
    assert r0["patched"] == r1["patched"] and r0["patched"]
    assert all(torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
    assert r0["scale"] == r1["scale"]
