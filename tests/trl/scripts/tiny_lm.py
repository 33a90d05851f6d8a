"""CPU-size random-init causal LMs from transformers' own classes (no download) and a character tokenizer, shared
by the TRL scripts beside it. Imports nothing of ampsafe.

Two settings take a tiny random-init model past float16's edge. ``initializer_range`` does it at init
(``EDGE_ARGS``): HF's ``_init_weights`` draws every linear weight from N(0, initializer_range), so a layer's output
grows with it (each MLP's ``down_proj`` sums ``intermediate_size`` products of two such projections). A high
learning rate does it by training from HF's default init (``GROWN_ARGS``).
"""

from __future__ import annotations

import string

MODELS = ("qwen3", "gemma3", "qwen3_moe")
# the script arguments at which the MLP's output passes 65504 on SFT's batches from the first step (float32 peaks
# 1.4-1.8x of it): a Qwen3-MoE's expert output is scaled by its routing weight (<= 1), so its init is wider, and its
# experts run eagerly (see ``model``: transformers' default grouped_mm keeps them float32 under fp16 autocast)
EDGE_ARGS = {
    "qwen3": ("--init-range", "3.5"),
    "gemma3": ("--init-range", "3.5"),
    "qwen3_moe": ("--init-range", "4.0", "--experts", "eager"),
}
# the script arguments at which SFT grows the MLP's output past 65504 from HF's default init (0.02): Adam at lr 0.1
# (0.2 for Gemma3, whose growth is slower), in the upper part of the range where Wortsman et al. 2023 (arXiv
# 2309.14322) reproduce large-scale instabilities in small models, on a model 128 wide; an early layer's down_proj
# output grows in a few channels (Sun et al. 2024's massive activations, arXiv 2402.17762) and passes 65504 in
# float32 within 7-20 steps; at user fine-tuning lrs (2e-5..2e-4) nothing grows (bench/results/trl_fp16_growth.md)
GROWN_ARGS = {
    "qwen3": ("--hidden", "128", "--lr", "0.1"),
    "gemma3": ("--hidden", "128", "--lr", "0.2"),
    "qwen3_moe": ("--hidden", "128", "--lr", "0.1", "--experts", "eager"),
}
CHARS = string.ascii_lowercase + string.digits + " .,:=+?"
SPECIAL = ("<pad>", "<eos>", "<unk>")


def tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` (pad, eos, unk and one id per character of ``CHARS``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL, *CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.padding_side = "left"  # GRPO generates after the prompt
    return tok


def config(name: str, *, init_range: float = 0.02, hidden: int = 64, layers: int = 2):
    """The transformers config of model ``name`` at a CPU size: ``hidden`` wide, ``layers`` deep, 4 heads."""
    from transformers import Gemma3TextConfig, Qwen3Config, Qwen3MoeConfig

    vocab = len(SPECIAL) + len(CHARS)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=128,
        initializer_range=init_range,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    if name == "qwen3":
        return Qwen3Config(**common)
    if name == "gemma3":
        return Gemma3TextConfig(**common, sliding_window=16, query_pre_attn_scalar=hidden // 4)
    if name == "qwen3_moe":
        return Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden)
    raise ValueError(f"model must be one of {', '.join(MODELS)}, got {name!r}")


def model(name: str, *, seed: int = 0, experts: str | None = None, **options):
    """``AutoModelForCausalLM.from_config`` of :func:`config` (random init, seeded), float32 on the CPU.
    ``experts``: an MoE's ``experts_implementation`` (transformers' default ``grouped_mm`` is not autocast-enabled
    and runs the experts in their weights' dtype, float32 under fp16 AMP; ``eager`` runs each expert's
    ``F.linear`` under autocast, in float16)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    extra = {} if experts is None else {"experts_implementation": experts}
    return AutoModelForCausalLM.from_config(config(name, **options), **extra)


def sft_options(*, out: str, steps: int, batch: int, lr: float, fp16: bool) -> dict:
    """The ``SFTConfig`` arguments of every SFT run here: a constant ``lr``, 32-token rows, a log line per step, no
    checkpoints, the CPU, and float16 mixed precision when ``fp16``."""
    return dict(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        lr_scheduler_type="constant",
        max_length=32,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        fp16=fp16,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
