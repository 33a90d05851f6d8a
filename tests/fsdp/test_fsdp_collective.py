"""Ranks that see different evidence under FSDP2 (2 gloo ranks): every forward is collective there, so a rank
must never replay or scan a batch alone. Rank 0's batch overflows in the forward, rank 1's holds a NaN sample.

Before the heal's branches were decided collectively (``ampsafe.healing.floor_replay.anywhere``), ``ampsafe.heal`` on
these batches ended the run: rank 1 returned its data verdict while rank 0 scanned (FSDP2 all-gathers against an
all_gather_object), and gloo aborted the processes ("Received data size doesn't match expected size. Is there a
distributed collective mismatch?") or they waited; a scaler at its floor took a data step on rank 1 and a heal on
rank 0, and the ranks' scales parted."""

from __future__ import annotations

import pytest


@pytest.mark.dist
def test_fsdp2_ranks_with_different_evidence_decide_alike_and_never_hang(tmp_path, free_port, worker_module, ranks):
    import torch

    workers = worker_module("fsdp_workers")
    ranks(workers.split_evidence_worker, free_port, str(tmp_path), timeout=240)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    # ampsafe.heal: both ranks raise the same error, which names rank 1's bad sample: not in the model
    assert r0["heal"] == r1["heal"] and r0["heal"].startswith("LossScaleFloorError: not healed: the overflow is not")
    assert "rank 1: input 0" in r0["heal"] and "sample 3" in r0["heal"]
    # the scaler: at the floor, rank 1's bad sample makes steps 1 and 2 data steps on both ranks; step 3 (both
    # overflow) heals on both, alike
    assert r0["input_steps"] == r1["input_steps"] == 2
    assert r0["scales"] == r1["scales"] and r0["scales"][:3] == [1.0, 1.0, 1.0]
    assert r0["heals"] == r1["heals"] and [h[0] for h in r0["heals"]] == [3] and "4" in r0["heals"][0][1]
    assert all(torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
