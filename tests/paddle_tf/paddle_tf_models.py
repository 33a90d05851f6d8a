"""Tiny Paddle transformers for the tests beside this file.

``Encoder`` is Paddle's own ``nn.TransformerEncoder`` (post-norm, dropout 0.1) under an embedding and a token head.
``SdpaBlock`` calls ``F.scaled_dot_product_attention`` (or ``flash_attention``) itself. ``WindowAttention``
attends inside a local window by adding a ``-inf`` buffer to its logits before the softmax: the design of
SVTR's Local mixer (PaddleOCR), written here from that description so it runs without a PaddleOCR tree.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

VOCAB, D_MODEL, HEADS, FFN, LAYERS, SEQ = 50, 32, 4, 64, 2, 7


class Encoder(nn.Layer):
    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=dropout)
        self.enc = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, ids, mask=None):
        return self.head(self.enc(self.emb(ids), src_mask=mask))


def token_batch(seed: int = 0, batch: int = 2):
    """(ids, keep): token ids and which positions are real; the second sequence is padded after 4 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(batch, SEQ))
    keep = np.ones((batch, SEQ), dtype=bool)
    keep[1, 4:] = False
    ids[~keep] = 0
    return paddle.to_tensor(ids), keep


def padding_mask(keep: np.ndarray, kind: str):
    """The padding mask as users hand it to ``nn.TransformerEncoder``: ``[batch, 1, 1, seq]``.

    ``"finfo"``: additive, ``finfo(float32).min`` at padded keys (HF style); ``"bool"``: True where attended
    (Paddle turns it into -1e9); ``"none"``: no mask.
    """
    if kind == "none":
        return None
    keep = keep[:, None, None, :]
    if kind == "bool":
        return paddle.to_tensor(keep)
    if kind == "finfo":
        return paddle.to_tensor(np.where(keep, 0.0, np.finfo(np.float32).min).astype("float32"))
    raise ValueError(kind)


def token_loss(logits, ids):
    return F.cross_entropy(logits.astype("float32").reshape([-1, VOCAB]), ids.reshape([-1]))


class SdpaBlock(nn.Layer):
    """Pre-projection, one fused attention call, output projection and a post-norm residual."""

    def __init__(self, kind: str = "sdpa", dropout: float = 0.1):
        super().__init__()
        self.kind, self.dropout = kind, dropout
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.norm = nn.LayerNorm(D_MODEL)

    def qkv_heads(self, x):
        b, s, d = x.shape
        return self.qkv(x).reshape([b, s, 3, HEADS, d // HEADS]).unbind(2)

    def forward(self, x, mask=None):
        b, s, d = x.shape
        q, k, v = self.qkv_heads(x)
        if self.kind == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout, training=self.training)
        else:
            from paddle.nn.functional.flash_attention import flash_attention

            a = flash_attention(q, k, v, dropout=self.dropout, causal=True, training=self.training)[0]
        return self.norm(x + self.out(a.reshape([b, s, d])))


class WindowAttention(nn.Layer):
    """Self-attention over a 1-D sequence restricted to a window of ``window`` neighbours by a ``-inf`` buffer."""

    def __init__(self, seq: int = 12, window: int = 3):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, 10)
        i = np.arange(seq)
        far = np.abs(i[:, None] - i[None, :]) > window // 2
        self.mask = paddle.to_tensor(np.where(far, -np.inf, 0.0).astype("float32")[None, None])  # a buffer

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape([b, s, 3, HEADS, d // HEADS]).transpose([2, 0, 3, 1, 4]).unbind(0)
        attn = paddle.matmul(q * (d // HEADS) ** -0.5, k, transpose_y=True)
        attn = F.softmax(attn + self.mask, axis=-1)
        y = paddle.matmul(attn, v).transpose([0, 2, 1, 3]).reshape([b, s, d])
        return self.head(self.norm(x + self.proj(y)))
