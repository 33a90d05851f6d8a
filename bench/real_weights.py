"""Real trained weights: PaddleOCR's shipped PP-OCRv4 det, fine-tuned under emulated Paddle AMP, six ways.

    PYTHONPATH=. AMPSAFE_SHARED=/path/to/shared python bench/real_weights.py [--seeds 0 1 2] [--modes ...]
    ... bench/real_weights.py --freeze-bn --pages screens --epochs 12 --train-pages 16 --eval-pages 64

The first runs the student config's recipe as it is (BatchNorm in train mode, paper pages): results/real_weights.
The second fine-tunes on dark-mode screens (light text on near-black, where the shipped head conv passes 65504
in inference) with every BatchNorm frozen, for 96 steps: results/real_weights-frozen-screens.

Every mode of :mod:`ampsafe_lab.workloads.ppocrv4.finetune` (fp32, native, fix_nan, heal, island, convbn) runs the
same recipe on the same pages for each seed; hmean is PaddleOCR's own ``DBPostProcess`` + ``DetMetric`` on
held-out pages (:mod:`ampsafe_lab.workloads.ppocrv4.metric`), before and after, and after once more with the
shipped BatchNorm running statistics put back: the trained weights apart from what the run folded into the
statistics (in train mode, a batch of two folds its spikes in, in FP32 as in float16). Writes
``bench/results/<topic>.json|md`` after every seed, so an interrupted bench keeps the seeds it finished. Not a
``bench_*`` topic: at ~25 minutes on 2 cores it stays out of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

try:
    from bench.common import write_result
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.common import write_result

TOPIC = "real_weights"
EVAL_PAGES = 16


def _final_loss(losses: list) -> float:
    finite = [x for x in losses if math.isfinite(x)][-5:]
    return sum(finite) / len(finite) if finite else float("nan")


def _statistics(model) -> dict:
    """A copy of the model's BatchNorm running statistics (Paddle keeps them as ``_mean`` / ``_variance``)."""
    return {k: v.numpy().copy() for k, v in model.state_dict().items() if k.endswith(("_mean", "_variance"))}


def _hmean_with_statistics(w, statistics: dict, eval_pages: int) -> float:
    """hmean with ``statistics`` put in place of the model's own, which are restored afterwards: the trained
    weights judged apart from what their training folded into the running statistics."""
    from ampsafe_lab.workloads.ppocrv4.metric import paddleocr_hmean

    state, own = w.model.state_dict(), _statistics(w.model)
    for name, value in statistics.items():
        state[name].set_value(value)
    try:
        return paddleocr_hmean(w, eval_pages)["hmean"]
    finally:
        for name, value in own.items():
            state[name].set_value(value)


def one_seed(seed: int, modes: list[str], recipe, eval_pages: int = EVAL_PAGES) -> list[dict]:
    from ampsafe_lab.workloads.ppocrv4.finetune import finetune
    from ampsafe_lab.workloads.ppocrv4.metric import paddleocr_hmean

    rows, before = [], None
    for mode in modes:
        w = recipe.workload(seed)
        if before is None:  # the same shipped weights and held-out pages for every mode of a seed
            before = paddleocr_hmean(w, eval_pages)
        shipped = _statistics(w.model)
        run = finetune(mode, recipe, seed=seed, workload=w)
        after = paddleocr_hmean(w, eval_pages)
        weights_only = _hmean_with_statistics(w, shipped, eval_pages)
        rows.append({
            "seed": seed, "mode": mode,
            "overflowing_steps": sum(run.overflowed),
            "overflowed_at": [i for i, o in enumerate(run.overflowed) if o],
            "final_scale": run.scales[-1] if mode != "fp32" else None,
            "final_loss": _final_loss(run.losses),
            "hmean_before": before["hmean"], "hmean_after": after["hmean"],
            "precision_after": after["precision"], "recall_after": after["recall"],
            "hmean_after_shipped_statistics": weights_only,
            "head_amax": run.head_amax, "losses": run.losses, "scales": run.scales,
            "heals": run.heals, "notes": run.notes, "seconds": round(run.seconds, 1),
        })  # fmt: skip
        print(
            f"seed {seed} {mode}: {rows[-1]['overflowing_steps']} overflowing, hmean {before['hmean']:.3f} -> "
            f"{after['hmean']:.3f} ({weights_only:.3f} on the shipped BN statistics), loss "
            f"{rows[-1]['final_loss']:.3f}, {run.seconds:.0f} s; {'; '.join(run.notes)}",
            flush=True,
        )
    return rows


def _cell(value, digits=3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) and abs(value) >= 1000 else f"{value:.{digits}f}"


def markdown(data: dict) -> str:
    rows, recipe = data["rows"], data["recipe"]
    fp32 = {r["seed"]: r["hmean_after"] for r in rows if r["mode"] == "fp32"}
    lines = [
        f"Recipe: {recipe}. Paddle AMP {recipe['level']} emulated in float16 on CPU "
        f"(`ampsafe.paddle.emulate_fp16`), loss scale from {recipe['init_scale']:g}, dynamic. hmean: PaddleOCR's "
        f"`DBPostProcess` (the config's options) + `DetMetric` on {data.get('eval_pages', EVAL_PAGES)} held-out rendered pages of "
        f"{recipe['image_size']} px. Took {data['seconds']:.0f} s; 1-min load average {data['load'][0]:.1f} at the "
        f"start, {data['load'][1]:.1f} at the end (the 2 cores are shared with other sessions).",
        "",
        "| mode | seed | overflowing steps | heals (step: modules) | final scale | final loss | hmean before | "
        "hmean after | vs FP32 (points) | hmean after, shipped BN statistics |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        delta = 100 * (r["hmean_after"] - fp32[r["seed"]]) if r["seed"] in fp32 else None
        scale = "-" if r["final_scale"] is None else f"{r['final_scale']:g}"
        heals = ", ".join(f"{h['step']}: {len(h['paths'])}" for h in r["heals"]) or "-"
        lines.append(
            f"| {r['mode']} | {r['seed']} | {r['overflowing_steps']} | {heals} | {scale} | {r['final_loss']:.3f} | "
            f"{r['hmean_before']:.3f} | {r['hmean_after']:.3f} | {'-' if delta is None else f'{delta:+.2f}'} | "
            f"{_cell(r.get('hmean_after_shipped_statistics'))} |"
        )
    lines += ["", "| mode | mean hmean after | worst seed vs FP32 (points) |", "|---|---|---|"]
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        deltas = [100 * (r["hmean_after"] - fp32[r["seed"]]) for r in mine if r["seed"] in fp32]
        worst = f"{min(deltas):+.2f}" if deltas else "-"
        lines.append(f"| {mode} | {statistics.mean(r['hmean_after'] for r in mine):.3f} | {worst} |")
    seeds = sorted({r["seed"] for r in rows})
    for mode in dict.fromkeys(r["mode"] for r in rows):
        ran = sorted(r["seed"] for r in rows if r["mode"] == mode)
        if ran != seeds:
            lines.append(f"\n`{mode}` ran on seed(s) {', '.join(map(str, ran))} only.")
    lines += ["", "Notes (heals: step and islanded paths; patches):"]
    lines += [f"- seed {r['seed']} {r['mode']}: {'; '.join(r['notes'])}" for r in rows if r["notes"]]
    first = next((r for r in rows if r["mode"] == "fp32"), None)
    if first:
        amax = ", ".join(f"{a:.3g}" for a in first["head_amax"])
        lines += ["", f"FP32 `head.binarize.conv1` output amax per step (seed {first['seed']}): {amax}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ampsafe_lab.workloads.ppocrv4.finetune import MODES, FineTuneRecipe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--train-pages", type=int, default=8, help="pages in an epoch")
    ap.add_argument("--freeze-bn", action="store_true", help="every BatchNorm in eval mode")
    ap.add_argument("--pages", default="paper", help="page style: paper, or screens (light text on near-black)")
    ap.add_argument("--eval-pages", type=int, default=EVAL_PAGES, help="held-out pages for hmean")
    ap.add_argument("--topic", default=None, help="results/<topic>.json|md (a part of the seeds, run beside)")
    ap.add_argument("--torch", action="store_true", help="only the torch trajectory (FP32, native) of one seed")
    ap.add_argument("--merge", nargs="*", metavar="TOPIC", help="only merge these topics' rows into --topic")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.topic or TOPIC)
    recipe = FineTuneRecipe.documented(
        epochs=args.epochs, train_pages=args.train_pages, freeze_bn=args.freeze_bn, pages=args.pages
    )
    if args.torch:
        return torch_trajectory(args.seeds[0], recipe, f"{_topic(args)}-torch")
    topic = _topic(args)
    data = {
        "recipe": vars(recipe) | {"steps": recipe.steps, "warmup_steps": recipe.warmup_steps},
        "rows": [],
        "eval_pages": args.eval_pages,
    }
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    for seed in args.seeds:
        data["rows"] += one_seed(seed, args.modes, recipe, args.eval_pages)
        data["seconds"], data["load"] = time.perf_counter() - t0, [load0, os.getloadavg()[0]]
        write_result(topic, data, markdown(data))
    return 0


def _topic(args) -> str:
    """``--topic``, else real_weights[-frozen][-screens] after the recipe's options."""
    frozen = ["frozen"] if args.freeze_bn else []
    pages = [args.pages] if args.pages != "paper" else []
    return args.topic or "-".join([TOPIC, *frozen, *pages])


def torch_trajectory(seed: int, recipe, topic: str = f"{TOPIC}-torch") -> int:
    """results/<topic>.json|md: the recipe in torch, FP32 against native CPU autocast (CUDA's lists)."""
    from ampsafe_lab.workloads.ppocrv4.finetune import TORCH_MODES, finetune_torch

    runs = {mode: finetune_torch(mode, recipe, seed=seed) for mode in TORCH_MODES}
    data = {"seed": seed, "recipe": vars(recipe), "runs": {m: {k: v for k, v in vars(r).items() if k != "workload"}
            for m, r in runs.items()}}  # fmt: skip
    lines = [
        f"torch, seed {seed}, recipe {vars(recipe)}; native: `torch.autocast('cuda', float16)` with CUDA's op "
        "lists on the CPU (`--emulate-fp16`), `torch.amp.GradScaler` from 1024.",
        "",
        "| step | lr | FP32 head amax | FP32 loss | native head amax | native loss | native skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    fp32, native = runs["fp32"], runs["native"]
    for step in range(len(fp32.losses)):
        lines.append(
            f"| {step} | {recipe.lr_at(step):.2e} | {fp32.head_amax[step]:.4g} | {fp32.losses[step]:.3f} | "
            f"{native.head_amax[step]:.4g} | {native.losses[step]:.3f} | {native.overflowed[step]} |"
        )
    lines += ["", *(f"- {m}: {'; '.join(r.notes) or 'no notes'}" for m, r in runs.items())]
    write_result(topic, data, "\n".join(lines))
    return 0


def merge(topics: list[str], out: str = TOPIC) -> int:
    """results/<out>.json|md from the rows of ``topics`` (seeds run in processes side by side; where two
    hold the same seed and mode, the later one's row is kept)."""
    import json

    from bench.common import RESULTS

    parts = [json.loads((RESULTS / f"{topic}.json").read_text()) for topic in topics]
    rows = {(r["seed"], r["mode"]): r for p in parts for r in p["rows"]}  # a later part's rerun replaces a row
    data = {
        "recipe": parts[0]["recipe"], "rows": sorted(rows.values(), key=lambda r: r["seed"]),
        "seconds": max(p["seconds"] for p in parts), "load": [max(p["load"][i] for p in parts) for i in (0, 1)],
        "machine": parts[0]["machine"], "parts": topics, "eval_pages": parts[0].get("eval_pages", EVAL_PAGES),
    }  # fmt: skip
    write_result(out, data, markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
