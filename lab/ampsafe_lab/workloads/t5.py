"""``t5``: HF transformers' own ``T5ForConditionalGeneration`` at a CPU size, on synthetic token streams (PyTorch).

The report behind it is HF transformers issue #5651: fine-tuning T5 in float16, ``DenseReluDense.wo``'s output
reached 66246 > 65504 after 34 steps and the loss went NaN; HF's maintainers found ``wo`` by hand and ship
``_keep_in_fp32_modules = ["wo"]``. This workload builds the real HF class from a ``T5Config`` (random init, no
download, nothing of HF's code copied): 2 encoder and 2 decoder blocks, ``d_model`` 128, ``d_ff`` 2048 (t5-small's),
16 heads of 8, T5 v1.0's ReLU feed-forward (``DenseReluDense``), no dropout.

Why these sizes: T5 does not scale its attention logits by ``1/sqrt(d_kv)``. With 4 heads of 32 and ``d_ff`` 512
the recipe's QK logits pass 65504 a step before ``wo`` does (so eager attention would overflow first); 16 heads
of 8 and a wider feed-forward keep them about 2 bits below 65504 when ``wo`` crosses it, as in the report, where
``wo`` was the module. The task copies Zipf-distributed tokens (token ``k`` drawn with probability proportional
to ``1/k``), so the loss has something to fall to (the unigram entropy, about 3.9 nats, from ``ln 128`` = 4.85)
within a few dozen steps. The recipe that drives ``wo`` past 65504 is in :mod:`ampsafe_lab.workloads.t5_brink`.

    w = ampsafe_lab.workloads.build("t5", seed=0)
    loss = w.loss(w.batch(step))              # model(input_ids=..., attention_mask=..., labels=...).loss
    w.model(*w.example_inputs)                # (input_ids, attention_mask, decoder_input_ids)

``transformers`` is an optional extra (``pip install ampsafe[hf]``): it is imported when this workload is built,
never by ``import ampsafe``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import numpy as np

from ampsafe._framework import require
from ampsafe.errors import ConfigError, MissingFrameworkError

from .base import Workload

__all__ = ["T5Workload", "build", "MODEL", "emulated_cuda_amp", "keep_in_fp32_half"]

# T5ForConditionalGeneration's config at this size (T5 v1.0: ReLU feed-forward, the DenseReluDense of the report)
MODEL = {
    "vocab_size": 128,
    "d_model": 128,
    "d_kv": 8,
    "d_ff": 2048,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 16,
    "dropout_rate": 0.0,
    "feed_forward_proj": "relu",
}
_FIRST_TOKEN = 2  # 0 is pad (and the decoder's start token), 1 is eos: the data never holds them


class T5Workload(Workload):
    """``example_inputs`` = ``(input_ids, attention_mask, decoder_input_ids)`` for ``model(*example_inputs)``.

    ``batch(step)`` is a dict of ``model(**batch)`` keyword arguments (``input_ids``, ``attention_mask``,
    ``labels``); the labels are the input tokens (a copy task), and HF shifts them right into the decoder's inputs.
    """

    name = "t5"
    framework = "torch"

    def __init__(self, model, *, seed: int, seq_len: int, batch_size: int, device):
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.device = device
        super().__init__(model, (), seed=seed)
        first = self.batch(0)
        decoder_inputs = model._shift_right(first["labels"])
        self.example_inputs = (first["input_ids"], first["attention_mask"], decoder_inputs)

    def _tokens(self, step: int, split: str = "train") -> np.ndarray:
        vocab = self.model.config.vocab_size
        ranks = np.arange(1, vocab - _FIRST_TOKEN + 1, dtype=np.float64)
        p = (1.0 / ranks) / (1.0 / ranks).sum()
        rng = np.random.default_rng([self.seed, step, 0 if split == "train" else 1])
        return rng.choice(len(p), size=(self.batch_size, self.seq_len), p=p) + _FIRST_TOKEN

    def batch(self, step: int, split: str = "train") -> dict:
        """``{"input_ids", "attention_mask", "labels"}`` of batch ``step`` (int64, ``batch_size x seq_len``)."""
        torch = require("torch")
        ids = torch.from_numpy(self._tokens(step, split)).to(self.device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def loss(self, batch):
        """HF's own loss: token cross-entropy of ``model(**batch)`` (its ``.loss``)."""
        return self.model(**batch).loss

    def make_optimizer(self, lr: float):
        """Adam without weight decay (the recipe in :mod:`ampsafe_lab.workloads.t5_brink`)."""
        torch = require("torch")
        return torch.optim.Adam(self.model.parameters(), lr=lr)

    def evaluate(self, n_batches: int = 4) -> dict:
        """Mean token loss and greedy next-token accuracy on held-out batches (teacher forcing), no grad."""
        torch = require("torch")
        losses, hits, total = [], 0, 0
        with torch.no_grad():
            for i in range(n_batches):
                batch = self.batch(i, split="eval")
                out = self.model(**batch)
                losses.append(float(out.loss))
                hits += int((out.logits.argmax(-1) == batch["labels"]).sum())
                total += batch["labels"].numel()
        return {"loss": sum(losses) / len(losses), "accuracy": hits / total}


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise MissingFrameworkError(
            "the t5 workload needs HF transformers (pip install ampsafe[hf], or pip install transformers)"
        ) from exc
    return transformers


def build(*, seed: int = 0, seq_len: int = 32, batch_size: int = 8, device: str = "cpu", **config) -> T5Workload:
    """HF ``T5ForConditionalGeneration(T5Config(**MODEL, **config))`` with seeded random weights, in train mode.

    ``config`` overrides ``MODEL``'s fields (e.g. ``d_ff=1024``); any other ``T5Config`` field is passed on.
    """
    if seq_len < 2 or batch_size < 1:
        raise ConfigError(f"t5 needs seq_len >= 2 and batch_size >= 1, got {seq_len}, {batch_size}")
    torch = require("torch")
    transformers = _transformers()
    fields = {**MODEL, **config}
    if fields["vocab_size"] <= _FIRST_TOKEN:
        raise ConfigError(
            f"t5 vocab_size must be > {_FIRST_TOKEN} (pad and eos are reserved), got {fields['vocab_size']}"
        )
    cfg = transformers.T5Config(**fields, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(cfg)
    model.to(device).train()
    return T5Workload(model, seed=seed, seq_len=seq_len, batch_size=batch_size, device=device)


@contextlib.contextmanager
def emulated_cuda_amp() -> Iterator[None]:
    """While inside, ``torch.autocast("cuda", dtype=torch.float16)`` runs on the CPU with CUDA autocast's op lists.

    This is what ``ampsafe run --emulate-fp16`` does to a script (:mod:`ampsafe.torch.cuda_emulation`): CPU
    autocast alone would run T5's ``pow``/``softmax`` in float16 and differ from a GPU. Installed for the block
    only when not already in force; on a machine with CUDA nothing changes and ``"cuda"`` is the real device.
    """
    from ampsafe.torch import cuda_emulation

    installed = not cuda_emulation.active() and bool(cuda_emulation.install())
    try:
        yield
    finally:
        if installed and cuda_emulation.active():
            cuda_emulation.uninstall()


def keep_in_fp32_half(model) -> list[str]:
    """Cast ``model`` to float16 except the parameters HF keeps float32, as HF's loading does; returns those.

    ``from_pretrained(..., dtype=torch.float16)`` asks the model for its dtype plan
    (``model._get_dtype_plan(torch.float16)``: each ``_keep_in_fp32_modules`` entry mapped to float32) and
    searches each parameter name for the plan's patterns (``transformers.core_model_loading.build_glob_alternation``):
    a match is loaded in float32, the rest in float16. This applies the same plan, with HF's own functions, to a
    model already in memory, so a ``model._keep_in_fp32_modules = [...]`` line can be checked without a save and
    reload.
    """
    torch = require("torch")
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(torch.float16)
    pattern: re.Pattern | None = build_glob_alternation(list(plan))[0] if plan else None
    kept = []
    model.half()
    for name, param in model.named_parameters():
        if pattern is not None and pattern.search(name):
            param.data = param.data.float()
            kept.append(name)
    return kept
