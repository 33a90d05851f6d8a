"""Matmul-path policies on HF transformers: attention and FFN overflows, fixed by ``auto``/``island``, exactly.

The overflows are real float16 overflows of the model's own matmuls, made by scaling weights (no value is
edited after the fact): BERT's query/key weights x1000 push the QK logits past 65504; T5's ``wo`` weight is scaled
until its output is twice 65504 (HF transformers issue #5651's module). ``auto`` islands the attention module
that owns the QK matmul, the softmax input and the value matmul (with the projection that consumes it), and the
FFN output with the residual stream it feeds; the FP32 forward is bit-identical and the checkpoint keys are
unchanged. ``rescale`` has no exact power-of-two shift here: the residual add mixes the path with values it does
not scale, and it refuses, naming that add.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import batch, build  # noqa: E402

import ampsafe  # noqa: E402

WO = "decoder.block.1.layer.2.DenseReluDense.wo"


def _float16_step(model, inputs):
    """One float16 CPU-autocast forward and backward under ``watch``: the NonFiniteError, or None when clean."""
    try:
        with ampsafe.watch(model):
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(**inputs)
            out.loss.backward()
    except ampsafe.NonFiniteError as err:
        return err
    finally:
        model.zero_grad(set_to_none=True)
    return None


def _bert_with_hot_logits():
    model, inputs = build("bert", "eager").eval(), batch("bert")
    attn = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():
        attn.query.weight.mul_(1000.0)
        attn.key.weight.mul_(1000.0)
    return model, inputs


def _t5_with_hot_wo():
    model, inputs = build("t5", "eager", dropout_rate=0.0).eval(), batch("t5")
    wo = dict(model.named_modules())[WO]
    seen = {}
    handle = wo.register_forward_hook(lambda m, a, out: seen.__setitem__("amax", float(out.abs().max())))
    with torch.no_grad():
        model(**inputs)
        handle.remove()
        wo.weight.mul_(2 * 65504.0 / seen["amax"])
    return model, inputs


def _exact_and_same_keys(model, inputs, policy):
    keys = list(model.state_dict())
    with torch.no_grad():
        ref = model(**inputs).logits
    report = ampsafe.patch(model, inputs, policy=policy)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)
    assert list(model.state_dict()) == keys
    return report


@pytest.mark.parametrize("policy", ["auto", "island"])
def test_attention_logits_overflow_is_islanded_exactly(policy):
    model, inputs = _bert_with_hot_logits()
    err = _float16_step(model, inputs)
    assert err is not None and (err.module, err.kind) == ("bert.encoder.layer.0.attention.self", "overflow")
    report = _exact_and_same_keys(model, inputs, policy)
    assert {"bert.encoder.layer.0.attention.self", "bert.encoder.layer.0.attention.output.dense"} <= set(report.patched)
    if policy == "auto":  # only what is risky: the other layer keeps float16
        assert not any(p.startswith("bert.encoder.layer.1.") for p in report.patched)
    assert _float16_step(model, inputs) is None


def test_t5_wo_overflow_is_islanded_by_auto_exactly():
    model, inputs = _t5_with_hot_wo()
    err = _float16_step(model, inputs)
    assert err is not None and err.module == WO
    report = _exact_and_same_keys(model, inputs, "auto")
    assert WO in report.patched
    assert not any(p.startswith("encoder.") for p in report.patched)
    assert _float16_step(model, inputs) is None


def test_rescale_refuses_t5_ffn_naming_the_residual_add():
    model, inputs = _t5_with_hot_wo()
    report = ampsafe.patch(model, inputs, policy="rescale")
    assert report.patched == []
    assert "add mixes the path" in report.skipped[WO]
