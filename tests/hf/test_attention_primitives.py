"""What counts for headroom around attention: mask lanes, SDPA's logits, fill ops, discarded non-finite lanes.

Small torch modules pin each rule down, and a real HF BERT checks that the masks' exemption never hides a real
logits overflow.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import ampsafe  # noqa: E402

MIN = torch.finfo(torch.float32).min


class MaskedScores(nn.Module):
    """A linear's scores plus an additive mask of finfo.min, into a softmax (``to_softmax``) or returned raw."""

    def __init__(self, to_softmax: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.to_softmax = to_softmax

    def forward(self, x, mask):
        scores = self.lin(x) + mask
        return scores.softmax(-1) if self.to_softmax else scores


def _mask():
    m = torch.zeros(2, 8)
    m[1, 5:] = MIN
    return m


def test_mask_lanes_ending_in_a_softmax_are_not_an_overflow():
    report = ampsafe.scan(MaskedScores(True), (torch.randn(2, 8), _mask()))
    (path,) = report.paths
    assert not path.risky and path.amax < 100


def test_mask_lanes_that_reach_the_output_are_values():
    report = ampsafe.scan(MaskedScores(False), (torch.randn(2, 8), _mask()))
    (path,) = report.paths
    assert path.risky and path.overflows_in == "forward" and path.amax > 1e38


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(F.dropout(self.lin(x), 0.5, training=True))


def test_dropout_mask_buffer_is_not_measured_as_a_value():
    graph = ampsafe.scan(Dropout(), (torch.randn(4, 8),)).graph
    fills = [n for n in graph.nodes if n.kind.value == "fill"]
    values = [n.amax for n in graph.nodes if n.amax is not None]
    assert all(n.amax is None for n in fills)
    assert max(values) < 100


class Attention(nn.Module):
    def __init__(self, heads=2, dim=16, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, dim
        self.q = nn.Linear(heads * dim, heads * dim)
        self.k = nn.Linear(heads * dim, kv_heads * dim)
        self.v = nn.Linear(heads * dim, kv_heads * dim)
        self.o = nn.Linear(heads * dim, heads * dim)

    def qk(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, n, self.kvh, self.d).transpose(1, 2)
        return q, k

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k = self.qk(x)
        v = self.v(x).view(b, n, self.kvh, self.d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.h != self.kvh)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_sdpa_path_counts_its_float32_logits(kv_heads):
    torch.manual_seed(0)
    model = Attention(kv_heads=kv_heads)
    with torch.no_grad():
        model.q.weight.mul_(300.0)
        model.k.weight.mul_(300.0)
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 1, 6, 6)
    mask[1, ..., 4:] = MIN
    with torch.no_grad():
        q, k = model.qk(x)
        k = k.repeat_interleave(2 // kv_heads, dim=1)
        logits = float((q @ k.transpose(-1, -2) / math.sqrt(16)).abs().max())
    report = ampsafe.scan(model, (x, mask))
    sdpa = [n for n in report.graph.nodes if n.op == "scaled_dot_product_attention"]
    assert len(sdpa) == 1 and sdpa[0].kind.value == "matmul"
    path = next(p for p in report.paths if p.start_op == "scaled_dot_product_attention")
    assert logits > 65504
    assert path.amax == pytest.approx(logits, rel=1e-3)
    assert path.risky and path.overflows_in == "forward"


def test_a_real_logits_overflow_is_not_hidden_by_the_padding_mask():
    pytest.importorskip("transformers")
    from hf_models import batch, build

    model = build("bert", "eager").eval()
    attn = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():
        attn.query.weight.mul_(1000.0)
        attn.key.weight.mul_(1000.0)
    report = ampsafe.scan(model, batch("bert"))
    path = report.path("bert.encoder.layer.0.attention.self")
    assert path.risky and 65504 < path.amax < 1e30


# --------------------------------------------------------------------------------------------- watch
class Bucketing(nn.Module):
    """log(0) made and thrown away, as T5's relative-position bucketing does (``discard`` picks how)."""

    def __init__(self, discard: str):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.discard = discard

    def forward(self, x):
        pos = torch.arange(4, dtype=torch.float32)
        large = torch.log(pos / 2)  # log(0) = -inf in lane 0
        if self.discard == "where":
            bias = torch.where(pos < 2, pos, large)
        elif self.discard == "clamp":
            bias = large.clamp(min=-3.0)
        elif self.discard == "exp":
            bias = torch.exp(large)
        elif self.discard == "nan_to_num":
            bias = torch.nan_to_num(large, neginf=-5.0)
        elif self.discard == "maximum":
            bias = torch.maximum(large, torch.full_like(large, -2.0))
        elif self.discard == "softmax":
            bias = torch.softmax(large, dim=0)  # a masked softmax: exp(-inf) = 0
        elif self.discard == "long":
            bias = large.clamp(max=10.0).to(torch.long).clamp(min=0).float()
        else:
            bias = large
        return self.lin(x) + bias


@pytest.mark.parametrize("discard", ["where", "clamp", "nan_to_num", "maximum", "softmax", "exp", "long"])
def test_non_finite_lanes_no_value_carries_are_no_event(discard):
    model = Bucketing(discard)
    with ampsafe.watch(model) as w:
        loss = model(torch.randn(3, 4)).sum()
        loss.backward()
    assert w.events == [] and torch.isfinite(loss)


def test_non_finite_lane_reaching_the_output_is_an_event_named_at_its_origin():
    model = Bucketing("none")
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with ampsafe.watch(model):
            model(torch.randn(3, 4))
    assert (info.value.op, info.value.kind, info.value.phase) == ("log", "numerical", "forward")


def test_non_finite_value_reaching_the_loss_outside_the_model_is_an_event():
    model = nn.Linear(4, 4)
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with ampsafe.watch(model):
            out = model(torch.randn(3, 4))
            torch.log(out - out.detach()).mean()  # log(0) in every lane, into the scalar loss
    assert info.value.module == "<loss>" and info.value.op == "log"
