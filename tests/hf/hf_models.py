"""Tiny random-init HF transformers models (no downloads): 2 layers, hidden 32, sequences of 12 tokens.

Built from HF's own config and model classes, so the tests run HF's real attention, masks, dropout and losses.
Each batch carries a padding mask (the second sample's last 4 tokens are padding): HF's additive masks then hold
``torch.finfo(float32).min``, the value the scan must not take for an overflow.
"""

from __future__ import annotations

import torch
import transformers

MODELS = ("bert", "gpt2", "t5", "vit", "llama")
ATTENTION = ("sdpa", "eager")
VOCAB, SEQ, BATCH = 100, 12, 2


def build(name: str, attn: str = "sdpa", *, seed: int = 0, **overrides):
    """A random-init HF model of family ``name`` with attention implementation ``attn`` (train mode)."""
    tf = transformers
    torch.manual_seed(seed)
    if name == "bert":
        cfg = tf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            **overrides,
        )
        cls = tf.BertForMaskedLM
    elif name == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
            **overrides,
        )
        cls = tf.GPT2LMHeadModel
    elif name == "t5":
        cfg = tf.T5Config(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
            **overrides,
        )
        cls = tf.T5ForConditionalGeneration
    elif name == "vit":
        cfg = tf.ViTConfig(
            image_size=16,
            patch_size=4,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=3,
            **overrides,
        )
        cls = tf.ViTForImageClassification
    elif name == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
            **overrides,
        )
        cls = tf.LlamaForCausalLM
    else:
        raise ValueError(name)
    model = cls._from_config(cfg, attn_implementation=attn)
    return model.train()


def batch(name: str, *, seed: int = 1) -> dict:
    """Keyword inputs with labels (the model computes its own loss) and, for text, a padding mask."""
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g), "labels": torch.tensor([0, 2])}
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 4 :] = 0
    labels = ids[:, : SEQ - 4].clone() if name == "t5" else ids.clone()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def scale_past_float16(model, path: str, inputs: dict, factor: float = 2.0) -> None:
    """Scale ``path``'s weight so that its float32 output on ``inputs`` reaches ``factor`` x 65504: a real float16
    overflow of that layer (as T5's ``wo`` had in HF issue #5651), not values edited after the fact."""
    module = model.get_submodule(path)
    seen = {}
    handle = module.register_forward_hook(lambda m, a, out: seen.__setitem__("amax", float(out.abs().max())))
    with torch.no_grad():
        model(**inputs)
        handle.remove()
        module.weight.mul_(factor * 65504.0 / seen["amax"])
