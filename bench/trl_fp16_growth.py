"""Which float16 overflow does training grow in the TRL workloads' tiny models? Per optimizer step, in float32, the
peak |value| of every place a float16 forward can overflow under autocast, on the same model and data as
tests/trl/scripts/sft_train.py (TRL's ``SFTTrainer``, AdamW, constant lr, its default gradient clipping at 1.0).

Measured places (each a matmul whose float16 output would pass 65504; the residual adds, RMSNorms and softmaxes
run in float32 under autocast):

* ``down_proj``: each MLP's ``down_proj`` output (a Qwen3-MoE's eager experts: each expert's down projection
  before its routing weight), with the hidden channel holding the peak (Sun et al. 2024's massive activations sit
  in a few fixed channels);
* ``residual``: each decoder layer's output (float32 under autocast, recorded for the mechanism);
* ``attn_logits``: q.k^T * scaling before the softmax, after Qwen3's and Gemma3's q/k RMSNorm and RoPE;
* ``logits``: the final norm's output times ``lm_head.weight`` (TRL's SFT computes them so, in tiles, in its fused
  LM head: the ``lm_head`` module's forward never runs);
* ``router``: a Qwen3-MoE router's logits;
* ``linear``: the largest output of any ``nn.Linear`` (the module named).

How the grown workload (tests/trl/scripts/tiny_lm.py's ``GROWN_ARGS``) was found, stage by stage (the table):

1. HF's default init (0.02), 64 wide, 60 steps. At the lrs users fine-tune with (TRL's SFT default 2e-5, LoRA's
   usual 2e-4) and at nanoGPT's 1e-3 for baby networks (its config/train_shakespeare_char.py) nothing grows: every
   place stays under 10 (down_proj under 2), also at 1e-3 on models 128 and 256 wide. In Wortsman et al. 2023's
   range ("Small-scale proxies for large-scale Transformer training instabilities", arXiv 2309.14322: lrs
   3e-4..3e-1 reproduce large-scale instabilities in small models) the MLP output grows: Qwen3 passes 65504 at lr
   0.1 (step 25) and 0.3 (step 7), Qwen3-MoE's experts at 0.1 (step 34) and 0.3, Gemma3 only at 0.3; in each the
   loss spikes in the first steps (up to 22 from 3.9), then ends under its step-1 value.
2. A stand-in checkpoint 1.7 bits under 65504 (init range 2.0: down_proj's peak 19456 at step 1) does not grow past
   24064 at user lrs (2e-5..1e-3, 60 steps) nor past 34816 at 1e-2.
3. Wider models grow at lower lrs, as Wortsman et al. report for larger models: 128 wide passes 65504 at lr 0.1 by
   step 14, 256 wide at 3e-2 by step 27; Gemma3 128 wide at 0.1 by step 32, at 0.2 by step 10.
4. The step count sets sft_train.py's data (its dataset holds batch * steps * 2 texts, shuffled), so each candidate
   was rerun at 32, 40, 48 and 56 steps: 64 wide at lr 0.1 passes or not by the data order (step 25, 30 or never);
   128 wide at lr 0.1 passes at steps 9-14 (Qwen3), 9-20 (Qwen3-MoE), and Gemma3 at lr 0.2 at steps 7-10. These
   are ``GROWN_ARGS``.

The mechanism is one: the first or second layer's MLP ``down_proj`` output grows in a few channels, as Sun et al.
2024's massive activations ("Massive activations in large language models", arXiv 2402.17762: a few fixed
channels, from an early layer's MLP), and Qwen3 carries them into its residual stream (float32 under autocast).
Gemma3 normalizes each MLP output before the residual add (``post_feedforward_layernorm``), so its stream stays
under 240 while its ``down_proj`` passes 65504. The other places stay far from the edge in every candidate: the
attention logits under 90 (Qwen3 and Gemma3 normalize q and k, the qk-layernorm Wortsman et al. find prevents
attention-logit growth), the output logits under 75 (no output-logit divergence within 60 steps) and the MoE
router's logits under 350. Gemma's embedding scale (sqrt(hidden_size)) multiplies float32 embeddings under
autocast: its stream starts near 8 and stays small.

``python -m bench.trl_fp16_growth --search`` runs every candidate of ``SEARCH`` and writes
bench/results/trl_fp16_growth.{md,json}; ``--model M --lrs ... --steps N [--init-range R] [--hidden H]`` prints
the peaks of those candidates only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_result

SCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "trl" / "scripts"
FP16_MAX = 65504.0
PLACES = ("down_proj", "residual", "attn_logits", "logits", "router", "linear")
WORDS = "the cat sat on a mat and ate two red figs while one dog ran by the old oak tree".split()


def text(i: int) -> str:
    """sft_train.py's training text ``i``."""
    a, b = (i * 7) % 50, (i * 13) % 50
    return f"{a}+{b}={a + b}. " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4))


class Peaks:
    """The running peak of each place over one optimizer step: ``{place: (peak, module, channel)}``."""

    def __init__(self) -> None:
        self.step: dict[str, tuple[float, str, int]] = {}

    def see(self, place: str, tensor, name: str, channel: bool = False) -> None:
        import torch

        value = tensor.detach().abs()
        peak = float(value.max())
        if place in self.step and self.step[place][0] >= peak:
            return
        dim = int(torch.argmax(value.reshape(-1, value.shape[-1]).amax(0))) if channel else -1
        self.step[place] = (peak, name, dim)

    def take(self) -> dict[str, tuple[float, str, int]]:
        step, self.step = self.step, {}
        return step


def _register_probe_attention(peaks: Peaks) -> str:
    """An attention implementation that records q.k^T * scaling and then computes eager attention."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    def probe(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        peaks.see("attn_logits", scores, f"layers.{module.layer_idx}.self_attn")
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : key.shape[-2]]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    AttentionInterface.register("ampsafe_probe", probe)
    ALL_MASK_ATTENTION_FUNCTIONS.register("ampsafe_probe", eager_mask)
    return "ampsafe_probe"


def _hook(model, peaks: Peaks) -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    hidden = model.config.hidden_size
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):

            def linear(mod, args, out, name=name):
                peaks.see("linear", out, name)
                if name.endswith("down_proj"):
                    peaks.see("down_proj", out, name, channel=True)

            module.register_forward_hook(linear)
        elif name.endswith("mlp.gate") and type(module).__name__.endswith("Router"):
            module.register_forward_hook(lambda mod, args, out, name=name: peaks.see("router", out[0], name))
        elif name.endswith("mlp.experts"):

            class Experts(TorchFunctionMode):
                """Each expert's ``F.linear`` outputs (the down projection is the one ``hidden`` wide)."""

                def __torch_function__(self, func, types, args=(), kwargs=None, name=name):
                    out = func(*args, **(kwargs or {}))
                    if func is torch.nn.functional.linear:
                        peaks.see("linear", out, name)
                        if out.shape[-1] == hidden:
                            peaks.see("down_proj", out, name, channel=True)
                    return out

            mode = Experts()
            module.register_forward_pre_hook(lambda mod, args, mode=mode: mode.__enter__() and None)
            module.register_forward_hook(lambda mod, args, out, mode=mode: mode.__exit__(None, None, None))
        elif name == "model.norm":  # TRL's fused LM head multiplies its output by lm_head.weight in tiles

            def logits(mod, args, out):
                peaks.see("logits", out @ model.get_output_embeddings().weight.T, "lm_head")

            module.register_forward_hook(logits)
        elif name.count(".") == 2 and ".layers." in name:  # model.layers.N

            def layer(mod, args, out, name=name):
                peaks.see("residual", out[0] if isinstance(out, tuple) else out, name, channel=True)

            module.register_forward_hook(layer)


def run(model_name: str, lr: float, steps: int, init_range: float, hidden: int, batch: int) -> list[dict]:
    """SFT ``steps`` steps in float32; the peaks of each step's forward (the weights after the step before)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import tiny_lm

    peaks = Peaks()
    attention = _register_probe_attention(peaks)
    torch.manual_seed(0)  # as tiny_lm.model
    extra = {"experts_implementation": "eager"} if model_name == "qwen3_moe" else {}
    config = tiny_lm.config(model_name, init_range=init_range, hidden=hidden)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, **extra)
    _hook(model, peaks)
    rows: list[dict] = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            rows.append({"step": state.global_step, **{k: list(v) for k, v in peaks.take().items()}})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if rows and logs and "loss" in logs:
                rows[-1]["loss"] = logs["loss"]
                rows[-1]["grad_norm"] = float(logs.get("grad_norm", float("nan")))

    dataset = Dataset.from_dict({"text": [text(i) for i in range(batch * steps * 2)]})
    out = tempfile.mkdtemp(prefix="trl-growth-")
    sft = SFTConfig(**tiny_lm.sft_options(out=out, steps=steps, batch=batch, lr=lr, fp16=False))
    trainer = SFTTrainer(
        model=model, args=sft, train_dataset=dataset, processing_class=tiny_lm.tokenizer(), callbacks=[Record()]
    )
    trainer.train()
    return rows


def first_past(rows: list[dict], place: str) -> int | None:
    """The first step (1-based, as TRL counts) whose forward put ``place`` past 65504 in float32."""
    return next((r["step"] for r in rows if place in r and r[place][0] > FP16_MAX), None)


def summary(rows: list[dict]) -> dict:
    out = {}
    for place in PLACES:
        seen = [r[place] for r in rows if place in r]
        if not seen:
            continue
        top = max(seen, key=lambda v: v[0])
        out[place] = {
            "first": seen[0][0],
            "max": top[0],
            "where": top[1],
            "channel": top[2],
            "last": seen[-1][0],
            "step_past_65504": first_past(rows, place),
        }
    return out


# the search, in the order it was run: (stage, model, hidden, init range, steps, lrs). Steps also set the data:
# sft_train.py's dataset holds batch * steps * 2 texts, so its shuffled order changes with the step count.
USER_LRS = (2e-5, 2e-4, 1e-3)  # TRL's SFT default; LoRA's usual; nanoGPT's for baby networks
PROXY_LRS = (1e-2, 3e-2, 1e-1, 3e-1)  # within Wortsman et al.'s sweep (3e-4..3e-1)
SEARCH = [
    ("HF default init, 64 wide", "qwen3", 64, 0.02, 60, USER_LRS + PROXY_LRS),
    ("HF default init, 64 wide", "gemma3", 64, 0.02, 60, USER_LRS + PROXY_LRS),
    ("HF default init, 64 wide", "qwen3_moe", 64, 0.02, 60, USER_LRS + PROXY_LRS),
    ("a checkpoint 1.7 bits under 65504 (init 2.0)", "qwen3", 64, 2.0, 60, USER_LRS + (1e-2,)),
    ("wider (Wortsman et al.: larger models grow at lower lrs)", "qwen3", 128, 0.02, 60, (1e-3, 1e-2, 3e-2, 1e-1)),
    ("wider (Wortsman et al.: larger models grow at lower lrs)", "qwen3", 256, 0.02, 60, (1e-3, 3e-3, 1e-2, 3e-2)),
    ("wider (Wortsman et al.: larger models grow at lower lrs)", "gemma3", 128, 0.02, 60, (3e-2, 1e-1, 2e-1)),
    ("wider (Wortsman et al.: larger models grow at lower lrs)", "qwen3_moe", 128, 0.02, 60, (3e-2, 1e-1)),
]
for _steps in (32, 40, 48, 56):  # the step of the first overflow, across data orders
    SEARCH += [("across data orders", "qwen3", h, 0.02, _steps, (1e-1, 2e-1)) for h in (64, 128)]
    SEARCH += [("across data orders", m, 128, 0.02, _steps, (1e-1, 2e-1)) for m in ("gemma3", "qwen3_moe")]


def candidate(stage: str, model: str, hidden: int, init_range: float, steps: int, lr: float) -> dict:
    start = time.perf_counter()
    rows = run(model, lr, steps, init_range, hidden, batch=4)
    cand = {"stage": stage, "model": model, "lr": lr, "init_range": init_range, "hidden": hidden, "steps": steps}
    cand["seconds"] = round(time.perf_counter() - start, 1)
    cand["summary"] = summary(rows)
    # per step: the loss and the down_proj peak (where the overflow grows), 4 significant digits
    cand["losses"] = [round(r.get("loss", float("nan")), 3) for r in rows]
    cand["down_proj_peaks"] = [float(f"{r['down_proj'][0]:.4g}") for r in rows]
    cells = [f"{p} {v['first']:.3g}->{v['max']:.3g} (step {v['step_past_65504']})" for p, v in cand["summary"].items()]
    print(model, f"lr={lr:g} r={init_range:g} h={hidden} steps={steps}:", "; ".join(cells), flush=True)
    return cand


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", action="store_true", help="run SEARCH (all candidates) and write the results")
    parser.add_argument("--model", default="qwen3", choices=("qwen3", "gemma3", "qwen3_moe"))
    parser.add_argument("--lrs", nargs="+", type=float, default=[2e-5, 1e-3, 1e-2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--init-range", type=float, default=0.02)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    if not args.search:
        for lr in args.lrs:
            candidate("ad hoc", args.model, args.hidden, args.init_range, args.steps, lr)
        return
    record = {"machine": machine(), "candidates": []}
    for stage, model, hidden, init_range, steps, lrs in SEARCH:
        for lr in lrs:
            record["candidates"].append(candidate(stage, model, hidden, init_range, steps, lr))
    write_result("trl_fp16_growth", record, markdown(record))


def _cell(v: dict | None) -> str:
    return f"{v['first']:.3g} -> {v['max']:.3g} ({v['step_past_65504'] or '-'})" if v else ""


def markdown(record: dict) -> str:
    lines = [
        "# TRL fp16 workloads: which overflow does training grow?",
        "",
        "Float32, OMP_NUM_THREADS=1, TRL's SFTTrainer (AdamW, constant lr, gradient clipping at 1.0) on "
        "tests/trl/scripts/sft_train.py's data and tiny_lm models, batch 4 (bench/trl_fp16_growth.py --search). "
        "Each cell: the peak |value| at step 1 -> the largest over the run (the first step past 65504, or -); "
        "`where`: the module and channel of the largest down_proj output.",
        "",
        "| stage | model | hidden | init range | steps | lr | " + " | ".join(PLACES) + " | where | loss 1 -> last |",
        "|---|---|---|---|---|---|" + "---|" * (len(PLACES) + 2),
    ]
    for c in record["candidates"]:
        down = c["summary"].get("down_proj", {})
        head = [c["stage"], c["model"], str(c["hidden"]), f"{c['init_range']:g}", str(c["steps"]), f"{c['lr']:g}"]
        cells = [_cell(c["summary"].get(place)) for place in PLACES]
        where = f"{down.get('where', '')} [{down.get('channel', '')}]"
        loss = f"{c['losses'][0]:.2f} -> {c['losses'][-1]:.2f} (max {max(c['losses']):.1f})"
        lines.append("| " + " | ".join(head + cells + [where, loss]) + " |")
    lines += ["", (__doc__ or "").split("\n\n", 1)[1].split("``python -m")[0].strip()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
