"""``llama``: HF transformers' own ``LlamaForCausalLM`` at a CPU size, on uniform random tokens (PyTorch).

Why a decoder LLM: float16 is coming back for RL fine-tuning of LLMs (issue 33), trained in pure float16 under
FSDP2 (``MixedPrecisionPolicy(param_dtype=torch.float16)``), where every layer and the residual stream between the
decoder layers are float16. This builds the real HF class from a ``LlamaConfig`` (random init, no download, nothing
of HF's code copied): 2 decoder layers, hidden 64, MLP 256, 4 heads, vocab 128, untied embeddings. The recipe that
drives its output past 65504 by training is in :mod:`ampsafe_lab.workloads.llama_brink`.

    w = ampsafe_lab.workloads.build("llama", seed=0)
    loss = w.loss(w.batch(step))              # model(input_ids=..., labels=...).loss
    w.model(*w.example_inputs)                # (input_ids,)

``transformers`` is an optional extra (``pip install ampsafe[hf]``), imported when this workload is built.
"""

from __future__ import annotations

import numpy as np

from ampsafe._framework import require
from ampsafe.errors import ConfigError

from .base import Workload
from .t5 import _transformers

__all__ = ["LlamaWorkload", "build", "MODEL"]

MODEL = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


class LlamaWorkload(Workload):
    """``example_inputs`` = ``(input_ids,)``; ``batch(step)`` = ``{"input_ids", "labels"}`` (next-token loss)."""

    name = "llama"
    framework = "torch"

    def __init__(self, model, *, seed: int, seq_len: int, batch_size: int, device):
        self.seq_len, self.batch_size, self.device = seq_len, batch_size, device
        super().__init__(model, (), seed=seed)
        self.example_inputs = (self.batch(0)["input_ids"],)

    def batch(self, step: int, split: str = "train") -> dict:
        """Uniform random tokens of batch ``step`` (int64, ``batch_size x seq_len``), the same for the same step."""
        torch = require("torch")
        rng = np.random.default_rng([self.seed, step, 0 if split == "train" else 1])
        tokens = rng.integers(0, self.model.config.vocab_size, size=(self.batch_size, self.seq_len))
        ids = torch.from_numpy(tokens).to(self.device)
        return {"input_ids": ids, "labels": ids.clone()}

    def loss(self, batch):
        """HF's own loss: next-token cross-entropy of ``model(**batch)`` (its ``.loss``)."""
        return self.model(**batch).loss

    def make_optimizer(self, lr: float):
        """Adam without weight decay (the recipe in :mod:`ampsafe_lab.workloads.llama_brink`)."""
        return require("torch").optim.Adam(self.model.parameters(), lr=lr)

    def evaluate(self, n_batches: int = 4) -> dict:
        """Mean token loss on held-out batches, no grad (random tokens: ``ln 128`` = 4.85 is the floor)."""
        torch = require("torch")
        with torch.no_grad():
            losses = [float(self.loss(self.batch(i, split="eval"))) for i in range(n_batches)]
        return {"loss": sum(losses) / len(losses)}


def build(*, seed: int = 0, seq_len: int = 32, batch_size: int = 8, device: str = "cpu", **config) -> LlamaWorkload:
    """HF ``LlamaForCausalLM(LlamaConfig(**MODEL, **config))`` with seeded random weights, in train mode."""
    if seq_len < 2 or batch_size < 1:
        raise ConfigError(f"llama needs seq_len >= 2 and batch_size >= 1, got {seq_len}, {batch_size}")
    torch = require("torch")
    transformers = _transformers()
    fields = {**MODEL, **config}
    if seq_len > fields["max_position_embeddings"]:
        raise ConfigError(f"llama seq_len {seq_len} > max_position_embeddings {fields['max_position_embeddings']}")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    model.to(device).train()
    return LlamaWorkload(model, seed=seed, seq_len=seq_len, batch_size=batch_size, device=device)
