"""The ``llama`` workload (HF's own ``LlamaForCausalLM`` at a CPU size) and its brink: float32 training with Adam
lr 0.2 drives the residual stream, then ``layers.0.mlp.down_proj``, past 65504 (``ampsafe_lab.workloads.llama_brink``)."""

from __future__ import annotations

import math

import pytest

import ampsafe
from ampsafe_lab.workloads import build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ampsafe_lab.workloads import llama_brink  # noqa: E402

FP16_MAX = 65504.0
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_llama_is_hf_llama_for_causal_lm_with_seeded_batches():
    w = build("llama", seed=0)
    assert type(w.model) is transformers.LlamaForCausalLM and w.model.training
    cfg = w.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 256, 2, 128)
    a, b = w.batch(3), w.batch(3)
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], w.batch(4)["input_ids"])
    assert math.isfinite(float(w.loss(a).detach()))
    with pytest.raises(ampsafe.errors.ConfigError, match="max_position_embeddings"):
        build("llama", seq_len=65)


def test_the_brink_grows_the_stream_then_down_proj_past_65504_by_training():
    rec = llama_brink.brink_record(0)
    assert rec["first_layer"] == llama_brink.STREAM  # the residual stream crosses first ...
    assert rec["largest_module_at_crossing"] == llama_brink.DOWN  # ... carried by down_proj, still in range then
    assert rec["largest_module_amax_at_crossing"] < FP16_MAX < rec["stream_at_crossing"]
    assert rec["steps_trained"] >= rec["crossed_step"] + 2
    probe = rec["probe"]
    assert probe[llama_brink.DOWN] > llama_brink.PROBE_FACTOR * FP16_MAX  # down_proj itself past 65504 at the brink
    assert all(v < FP16_MAX for k, v in probe.items() if k.endswith("o_proj"))
    history = rec["history"]  # grown by training: far inside float16's range at the start
    assert history[0]["max"] < 100 and [h["step"] for h in history] == list(range(len(history)))


def test_pure_float16_islands_hold_the_stream_where_nothing_casts_it_back():
    """The brink cast to float16 (``.half()``, DeepSpeed's classic fp16): the forward is non-finite; with
    ``down_proj`` and the norms the stream feeds as FP32 islands it is finite. ``down_proj``'s float32 output
    makes the residual add float32 (type promotion), so the stream stays float32 from there on; an island returns
    in float16 what float16 holds (the normalized stream), so the float16 ``q_proj`` after ``input_layernorm``
    takes it. (Under FSDP2 sharded per layer the next layer's inputs are cast to float16: tests/fsdp.)"""
    w, _, _ = llama_brink.brink_start(0)
    ids = w.example_inputs[0]
    with torch.no_grad():
        assert torch.isfinite(w.model(ids).logits).all()
        w.model.half()
        assert not torch.isfinite(w.model(ids).logits).all()
        norms = ["model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
        ampsafe.patch(w.model, policy="island", paths=[llama_brink.DOWN, *norms])
        seen = {}
        w.model.get_submodule(norms[0]).register_forward_hook(lambda m, i, o: seen.update(dtype=o.dtype))
        w.model.get_submodule(llama_brink.DOWN).register_forward_hook(lambda m, i, o: seen.update(down=o))
        logits = w.model(ids).logits
    assert seen["down"].dtype == torch.float32 and seen["down"].abs().max() > FP16_MAX  # kept: float16 can't hold it
    assert seen["dtype"] == torch.float16  # a normalized stream: back in float16 for q_proj
    assert torch.isfinite(logits).all()
