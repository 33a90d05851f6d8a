"""No false alarms on Paddle transformers: ``nn.TransformerEncoder`` with padding masks, fused attention
(``F.scaled_dot_product_attention`` / ``flash_attention``) recorded as one op, and a ``-inf`` buffer mask.

What counts for float16 headroom is a value the model computes: a mask's fill value (``finfo.min``, ``-inf``,
Paddle's -1e9 for bool masks) that ends in a masked softmax is not one, and a non-finite lane that no later value
carries is not an event for ``watch``. A real overflow is still found and named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402

import ampsafe  # noqa: E402
from ampsafe.core.graph import OpKind  # noqa: E402
from ampsafe.paddle import emulate_fp16  # noqa: E402
from ampsafe.paddle.backend import BACKEND  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from paddle_tf_models import (  # noqa: E402
    D_MODEL,
    HEADS,
    Encoder,
    SdpaBlock,
    WindowAttention,
    padding_mask,
    token_batch,
    token_loss,
)

ENCODER_PATHS = 15  # per layer q, k, v, QK, attention x V, out_proj, linear1, linear2; and the head


def _encoder(mode: str, seed: int = 0) -> Encoder:
    paddle.seed(seed)
    model = Encoder()
    getattr(model, mode)()
    return model


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("mask", ["finfo", "bool", "none"])
def test_transformer_encoder_has_no_risky_path_at_init(mode, mask):
    model = _encoder(mode)
    ids, keep = token_batch()
    report = ampsafe.scan(model, (ids, padding_mask(keep, mask)))
    assert len(report.paths) == ENCODER_PATHS
    assert report.risky == [] and report.risky_ops == [], report.to_markdown()
    qk = [p for p in report.paths if p.start.endswith("self_attn") and "softmax" in " ".join(p.ops)]
    assert len(qk) == 2 and all(p.amax < 100 for p in qk)  # the logits' own range, the mask lanes left out


def test_transformer_encoder_real_overflow_is_still_found_beside_the_mask():
    model = _encoder("eval")
    with paddle.no_grad():
        model.enc.layers[0].linear2.weight.set_value(model.enc.layers[0].linear2.weight * 1e5)  # ~2.6e5: 4x past 65504
    ids, keep = token_batch()
    report = ampsafe.scan(model, (ids, padding_mask(keep, "finfo")))
    risky = {p.start: p for p in report.risky}
    assert "enc.layers.0.linear2" in risky
    assert risky["enc.layers.0.linear2"].overflows_in == "forward"
    assert not any("self_attn" in start for start in risky), sorted(risky)


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("mask", ["finfo", "bool"])
def test_transformer_encoder_emulated_float16_step_is_clean_under_watch(level, mask):
    model = _encoder("train")
    ids, keep = token_batch()
    with ampsafe.watch(model) as w, emulate_fp16(model, level=level) as emu:
        loss = token_loss(model(ids, padding_mask(keep, mask)), ids)
        loss.backward()
    assert w.events == []
    assert bool(paddle.isfinite(loss))
    assert {"linear", "matmul"} <= emu.emulated
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(paddle.isfinite(g).all()) for g in grads)


def test_watch_still_names_a_real_overflow_after_linear2():
    model = _encoder("train")
    with paddle.no_grad():
        model.enc.layers[1].linear2.weight.set_value(model.enc.layers[1].linear2.weight * 3e5)
    ids, keep = token_batch()
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with ampsafe.watch(model), emulate_fp16(model, level="O1"):
            token_loss(model(ids, padding_mask(keep, "finfo")), ids).backward()
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "enc.layers.1.linear2", "linear", "overflow")


def test_transformer_encoder_island_is_exact_in_fp32_and_keeps_keys():
    model = _encoder("eval")
    ids, keep = token_batch()
    inputs = (ids, padding_mask(keep, "finfo"))
    reference = model(*inputs).numpy()
    keys = list(model.state_dict())
    patched = ampsafe.patch(model, inputs, policy="island")
    assert "enc.layers.0.self_attn" in patched.patched and "enc.layers.1.linear2" in patched.patched
    out = model(*inputs).numpy()
    assert np.abs(out - reference).max() == 0.0
    assert list(model.state_dict()) == keys
    ampsafe.unpatch(model)
    assert list(model.state_dict()) == keys


# ------------------------------------------------------------------------------------------- fused attention
def _hand_logits_amax(block: SdpaBlock, x) -> float:
    q, k, _ = block.qkv_heads(x)
    q, k = q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3])
    return float(paddle.matmul(q * (D_MODEL // HEADS) ** -0.5, k, transpose_y=True).abs().max())


@pytest.mark.parametrize("kind", ["sdpa", "flash"])
def test_fused_attention_is_one_op_with_its_logits_measured_as_a_path(kind):
    paddle.seed(0)
    block = SdpaBlock(kind)
    block.eval()
    x = paddle.randn([2, 7, D_MODEL])
    _, keep = token_batch()
    mask = paddle.to_tensor(keep[:, None, None, :]) if kind == "sdpa" else None
    op = "scaled_dot_product_attention" if kind == "sdpa" else "flash_attention"
    graph = BACKEND.trace(block, (x, mask))
    nodes = [n for n in graph.nodes if n.op == op]
    assert len(nodes) == 1 and nodes[0].kind is OpKind.MATMUL
    assert not any(n.op in ("softmax", "matmul") for n in graph.nodes)  # the CPU fallback's ops are inside it
    # q and k scaled by 300 each: logits 9e4 times larger, past 65504, while the output (a mean of v) stays small
    with paddle.no_grad():
        w = block.qkv.weight.numpy().copy()
        w[:, : 2 * D_MODEL] *= 300.0
        block.qkv.weight.set_value(w)
    logits = _hand_logits_amax(block, x)
    assert logits > 65504
    report = ampsafe.scan(block, (x, mask))
    path = next(p for p in report.paths if p.start_op == op)
    assert path.amax == pytest.approx(logits, rel=1e-4)
    assert path.risky and path.overflows_in == "forward"
    with paddle.no_grad():
        q, k, v = block.qkv_heads(x)
    assert float(v.abs().max()) < 100


@pytest.mark.parametrize("mask", ["bool", "finfo", "flash"])
def test_fused_attention_emulated_float16_step_is_clean_under_watch(mask):
    paddle.seed(0)
    block = SdpaBlock("flash" if mask == "flash" else "sdpa")
    block.train()
    x = paddle.randn([2, 7, D_MODEL])
    _, keep = token_batch()
    attn_mask = None if mask == "flash" else padding_mask(keep, mask)
    assert ampsafe.scan(block, (x, attn_mask)).risky == []
    with ampsafe.watch(block) as w, emulate_fp16(block, level="O1") as emu:
        block(x, attn_mask).square().mean().backward()
    assert w.events == []
    assert ("flash_attention" if mask == "flash" else "scaled_dot_product_attention") in emu.emulated


# ------------------------------------------------------------------------------------------- -inf buffer mask
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_inf_buffer_mask_is_no_risk_and_no_event(level):
    paddle.seed(0)
    model = WindowAttention()
    x = paddle.randn([2, 12, D_MODEL])
    report = ampsafe.scan(model, (x,), level=level)
    # qkv, the two root matmuls (QK and attention x V: one start, merged), proj, head
    assert len(report.paths) == 4 and report.risky == [] and report.risky_ops == [], report.to_markdown()
    with ampsafe.watch(model) as w, emulate_fp16(model, level=level):
        loss = model(x).square().mean()
        loss.backward()
    assert w.events == [] and bool(paddle.isfinite(loss))


def test_a_non_finite_trainable_parameter_is_still_an_event():
    paddle.seed(0)
    model = WindowAttention()
    with paddle.no_grad():
        bias = model.proj.bias.numpy().copy()
        bias[0] = np.inf
        model.proj.bias.set_value(bias)
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(paddle.randn([2, 12, D_MODEL]))
    assert (info.value.kind, info.value.module) == ("parameter", "proj")


class LogBuckets(paddle.nn.Layer):
    """A relative-position bias bucketed by ``log(distance)``, its ``log(0)`` lanes thrown away by ``where`` and
    ``clip`` (T5's bucketing, in Paddle): the ``-inf`` never reaches a later value."""

    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(D_MODEL, D_MODEL)
        self.bias = paddle.nn.Embedding(4, 1)

    def forward(self, x):
        s = x.shape[1]
        pos = paddle.arange(s, dtype="float32")
        dist = paddle.abs(pos.unsqueeze(0) - pos.unsqueeze(1))
        logs = paddle.log(dist)  # -inf on the diagonal
        buckets = paddle.clip(paddle.where(dist > 0, logs, paddle.zeros_like(logs)), 0, 3).astype("int64")
        attn = paddle.nn.functional.softmax(paddle.matmul(x, x, transpose_y=True) + self.bias(buckets)[..., 0], -1)
        return self.proj(paddle.matmul(attn, x))


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_log_of_zero_thrown_away_by_where_is_no_event(level):
    paddle.seed(0)
    model = LogBuckets()
    x = paddle.randn([2, 6, D_MODEL])
    with ampsafe.watch(model) as w, emulate_fp16(model, level=level):
        model(x).square().mean().backward()
    assert w.events == []
    assert ampsafe.scan(model, (x,)).risky == []
