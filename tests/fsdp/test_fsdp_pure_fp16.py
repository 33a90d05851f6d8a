"""FSDP2 in pure float16 (``MixedPrecisionPolicy(param_dtype=torch.float16)``), 2 gloo ranks on loopback: the
regression of issue 33 (three ``nn.Linear``, a target of 1e6) grows its last layers' float16 output past 65504 by
training. torch's scaler skips every step from then on; ampsafe's heals at its floor (its float32 replay really
runs float32 under FSDP2's float16 policy), and the ``fully_shard`` lines it prints, run before the model's own,
train without an overflow.

Why not the t5 brink (``ampsafe_lab.workloads.t5_brink``), measured with transformers 5.24: in pure float16 its
``DenseReluDense.wo`` output is inf, but HF's T5Block clamps float16 hidden states ("clamp inf values to enable
fp16 training") to 64512, so the loss (4.04) and every gradient stay finite; under FSDP2 on 2 ranks from the brink
the scale never dropped in 5 steps: nothing reaches a scaler to heal. A decoder LLM does overflow: the llama
brink (``ampsafe_lab.workloads.llama_brink``) in ``test_fsdp_llama.py``."""

from __future__ import annotations

import pytest


@pytest.mark.dist
def test_fsdp2_pure_float16_heals_and_its_fully_shard_fix_trains_without_overflow(
    tmp_path, free_port, worker_module, ranks
):
    import torch

    workers = worker_module("fsdp_workers")
    ranks(workers.regress_worker, free_port, str(tmp_path), timeout=240)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    native, heal, fix = r0["native"], r0["heal"], r0["fix"]
    crossed = native["outputs"].index(float("inf"))
    assert native["dtype"] == "torch.float16" and crossed > 0
    assert native["skipped"] == list(range(crossed, workers.STEPS))  # skips to the end
    # healed at the floor on both ranks, the same modules, the last Linear among them
    assert heal["heals"] == r1["heal"]["heals"] and len(heal["heals"]) == 1
    step, paths = heal["heals"][0]
    assert "4" in paths and step < workers.STEPS - 2
    assert all(v < float("inf") for v in heal["outputs"][step + 1 :])
    assert heal["skipped"] and max(heal["skipped"]) < step
    assert heal["fix"]["torch_fsdp2"][0].splitlines() == [  # the Linear layers among them (a ReLU holds none)
        f"fully_shard(model[{p}], mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))"
        for p in paths
        if p in ("0", "2", "4")
    ]
    # the printed lines applied from the start: no overflow, and the output goes past 65504 in float32
    assert fix["skipped"] == [] and max(fix["outputs"]) > 65504 and fix["dtype"] == "torch.float32"
    for mode in ("native", "heal", "fix"):
        assert all(
            torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0[mode]["params"], r1[mode]["params"])
        ), mode
