"""HF transformers nobody here wrote, at random init: no false alarms from scan or watch, island exact in FP32.

BERT, GPT-2, T5, ViT and Llama, each with SDPA and eager attention, in eval and train mode, on a batch with a
padding mask. What used to go wrong on exactly these: the uninitialized ``empty_like`` of train-mode dropout
measured as a value (BERT amax 1.9e26), the mask's ``finfo.min`` taken for an overflow (every attention block of
GPT-2 and BERT), and T5's ``log(0)`` in its position bucketing, discarded by ``torch.where``, stopping a healthy
float16 step under ``watch``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import ATTENTION, MODELS, batch, build  # noqa: E402

import ampsafe  # noqa: E402

MODES = ("eval", "train")
# conv/matmul paths at this size (merged per module and op); the same with SDPA and eager attention
PATHS = {"bert": 16, "gpt2": 11, "t5": 39, "vit": 16, "llama": 17}


def _model(name: str, attn: str, mode: str):
    return build(name, attn).train(mode == "train")


def _weight_modules(model) -> set[str]:
    kinds = (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv1d)
    gpt2_conv1d = type(model).__module__.startswith("transformers.models.gpt2")
    names = {
        n for n, m in model.named_modules() if isinstance(m, kinds) or (gpt2_conv1d and type(m).__name__ == "Conv1D")
    }
    return names


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attn", ATTENTION)
@pytest.mark.parametrize("name", MODELS)
def test_scan_finds_no_risky_path_at_init(name, attn, mode):
    model = _model(name, attn, mode)
    report = ampsafe.scan(model, batch(name))
    assert report.risky == [], report.to_markdown()
    assert report.risky_ops == [], report.to_markdown()
    assert len(report.paths) == PATHS[name]
    starts = {p.start for p in report.paths}
    assert _weight_modules(model) - {"lm_head", "cls.predictions.decoder"} <= starts | {""}
    amax = max(p.amax for p in report.paths)
    assert 0 < amax < 1e4, f"largest activation {amax}: real activations at init are O(10)"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [m for m in MODELS if m != "vit"])
def test_sdpa_is_one_recorded_op_with_its_mask_as_an_input(name, mode):
    model = _model(name, "sdpa", mode)
    graph = ampsafe.scan(model, batch(name)).graph
    ops = [n.op for n in graph.nodes]
    assert "scaled_dot_product_attention" in ops
    assert not {"empty_like", "bernoulli"} & {n.op for n in graph.nodes if n.amax is not None}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attn", ATTENTION)
@pytest.mark.parametrize("name", MODELS)
def test_float16_autocast_step_under_watch_is_clean(name, attn, mode):
    model = _model(name, attn, mode)
    with ampsafe.watch(model) as w:
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(**batch(name))
        out.loss.backward()
    assert w.events == []
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("attn", ATTENTION)
@pytest.mark.parametrize("name", MODELS)
def test_island_is_exact_in_fp32_and_keeps_state_dict_keys(name, attn):
    model = _model(name, attn, "eval")
    inputs = batch(name)
    keys = list(model.state_dict())
    with torch.no_grad():
        ref = model(**inputs).logits
    report = ampsafe.patch(model, inputs, policy="island")
    assert report.patched
    with torch.no_grad():
        out = model(**inputs).logits
    assert torch.equal(out, ref)
    assert list(model.state_dict()) == keys
    ampsafe.unpatch(model)
    assert list(model.state_dict()) == keys
