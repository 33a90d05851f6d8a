"""The llama brink (``ampsafe_lab.workloads.llama_brink``: HF ``LlamaForCausalLM``, its residual stream and
``layers.0.mlp.down_proj`` past 65504 by training) under FSDP2 in pure float16, each decoder layer and the model
``fully_shard``-ed with ``param_dtype=torch.float16``, 2 gloo ranks.

Measured before this heal's FSDP2 checks: the heal islanded ``down_proj`` and the norms the stream feeds, and the
next step crashed in ``layers.1.self_attn.q_proj``: "expected m1 and m2 to have the same dtype, but got: float !=
c10::Half" (an island's float32 output met float16 weights; no autocast casts it back in pure float16). With
islands returning what float16 holds in float16, the run went on to a second heal (``q_proj``, ``k_proj``,
``v_proj``, ``lm_head``) with every loss still NaN: FSDP2 casts each layer's inputs, the stream among them, to
float16, so no island of a module holds a stream past 65504. The heal then refused at the floor, on both ranks.
FSDP2 reads a unit's policy at every forward, so the heal now gives the decoder layers the stream passes between a
float32 policy for the run (both ranks alike) and islands the root's ``model.norm`` after them, and training goes
on with finite losses; its ``fully_shard`` lines, in place of the user's calls of those layers, train from the brink
without an overflow. With the model alone ``fully_shard``-ed (no cast between layers) the same heal holds: ``down_proj``'s float32
output makes the residual add float32, and training goes on with finite losses. The ``fully_shard`` lines it prints,
applied from the start, train without an overflow; without ``output_dtype=torch.float16`` on the norms they failed
in the first forward ("expected m1 and m2 to have the same dtype": a float32 norm output met the float16
``q_proj``)."""

from __future__ import annotations

import math

import pytest


@pytest.mark.dist
def test_fsdp2_pure_float16_llama_brink_heals_on_both_ranks_sharded_per_layer_or_whole(
    tmp_path, free_port, worker_module, ranks
):
    import torch

    pytest.importorskip("transformers")
    from ampsafe_lab.workloads import llama_brink

    llama_brink.brink_state(0)  # built once here, not by both ranks at once
    workers = worker_module("llama_workers")
    ranks(workers.brink_worker, free_port, str(tmp_path), ("pure", "pure_fix", "root", "fix"), timeout=400)
    steps = workers.STEPS
    r0, r1 = (torch.load(tmp_path / f"pure{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["skipped"] == r1["skipped"] == [0, 1]  # 4 -> 2 -> 1: the floor, then the heal
    # each decoder layer sharded: the layers the stream passes between get a float32 policy, on both ranks alike;
    # the root's norm after them is an island (float32 in, float16 out for the float16 lm_head)
    assert r0["error"] is None and r1["error"] is None
    assert r0["heals"] == r1["heals"] == [(2, ("model.layers.0", "model.layers.1", "model.norm"))]
    assert all(math.isfinite(v) for r in (r0, r1) for v in r["losses"][3:]) and len(r0["losses"]) == steps
    assert all(torch.equal(r0["params"][n], r1["params"][n]) for n in r0["params"])
    assert all(torch.isfinite(p).all() for p in r0["params"].values())
    lines = r0["fix"]["torch_fsdp2"][0].splitlines()
    assert (
        lines
        == r1["fix"]["torch_fsdp2"][0].splitlines()
        == [
            "fully_shard(model.model.layers[0], mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))",
            "fully_shard(model.model.layers[1], mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))",
            "fully_shard(model.model.norm, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.float16))",
        ]
    )
    assert "replaces your script's `fully_shard` call" in r0["fix"]["torch_fsdp2"][1]
    # those lines in place of the user's calls of the layers: no overflow from the brink on
    r0, r1 = (torch.load(tmp_path / f"pure_fix{r}.pt", weights_only=False) for r in (0, 1))
    for r in (r0, r1):
        assert r["error"] is None and r["skipped"] == [] and r["heals"] == []
        assert len(r["losses"]) == steps and all(math.isfinite(v) for v in r["losses"])
    assert all(torch.equal(r0["params"][n], r1["params"][n]) for n in r0["params"])
    # the model alone sharded: healed at the floor on both ranks alike, then finite
    r0, r1 = (torch.load(tmp_path / f"root{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["error"] is None and r1["error"] is None
    assert r0["heals"] == r1["heals"] and [h[0] for h in r0["heals"]] == [2]
    assert llama_brink.DOWN in r0["heals"][0][1]
    assert all(math.isfinite(v) for r in (r0, r1) for v in r["losses"][3:]) and len(r0["losses"]) == steps
    assert all(torch.equal(r0["params"][n], r1["params"][n]) for n in r0["params"])
    # its printed fully_shard lines (a norm's output back to float16), run before the model's own: no overflow
    lines = r0["fix"]["torch_fsdp2"][0].splitlines()
    assert lines == r1["fix"]["torch_fsdp2"][0].splitlines()
    norm = "fully_shard(model.model.norm, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.float16))"
    down = "fully_shard(model.model.layers[0].mlp.down_proj, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))"
    assert norm in lines and down in lines
    r0, r1 = (torch.load(tmp_path / f"fix{r}.pt", weights_only=False) for r in (0, 1))
    for r in (r0, r1):
        assert r["error"] is None and r["skipped"] == [] and r["heals"] == []
        assert len(r["losses"]) == steps and all(math.isfinite(v) for v in r["losses"])
    assert all(torch.equal(r0["params"][n], r1["params"][n]) for n in r0["params"])
