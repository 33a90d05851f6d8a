"""TRL's ``SFTTrainer`` and ``GRPOTrainer`` with ``fp16=True``, native against ``ampsafe run``, on CPU-size
random-init Qwen3, Gemma3 and Qwen3-MoE (transformers' own classes, tests/trl/scripts/tiny_lm.py).

The scripts are the unmodified ones of tests/trl/scripts; float16 is emulated on this CPU as a GPU runs it:

* ``native``: torch's own ``GradScaler`` (no floor), only the CUDA emulation in place (tests/trl/native.py);
* ``ampsafe``: ``ampsafe run --emulate-fp16`` with its defaults (``--on-floor heal``, floor 1);
* ``fp32``: the plain script (accelerate on a CPU ignores ``fp16=True``): the float32 reference losses.

The workload (tiny_lm's ``EDGE_ARGS``): ``initializer_range`` (``--init-range``, HF's N(0, r) for every linear
weight: 3.5 for Qwen3 and Gemma3, 4.0 for Qwen3-MoE) set so that the MLP's ``down_proj`` output (the MoE's experts,
run eagerly: transformers' default ``grouped_mm`` experts are not autocast-enabled and stay float32 under fp16 AMP)
passes 65504 in float32 on the training batches from the first step, at TRL's own default learning rates (SFTConfig 2e-5, GRPOConfig 1e-6). At those rates the tiny models'
activations do not grow (measured: a Qwen3 at r=2 keeps its down_proj peak at 19316-19317 over 40 AdamW steps at
2e-5, and under 20000 at 1e-3), so the edge is set by the init, standing in for a checkpoint whose residual stream
already passes float16's range. Each run's figures: from ampsafe's report.json (ampsafe) or the scale each
``GradScaler.update`` went from and to (native), and the losses from TRL's own ``trainer_state.json`` log history.

A workload ``grown`` (SFT; tiny_lm's ``GROWN_ARGS``, ``--grown-steps`` steps) whose overflow training grows: HF's
default init (0.02), a model 128 wide, AdamW at lr 0.1 (Gemma3: 0.2), in the range where Wortsman et al. 2023
("Small-scale proxies for large-scale Transformer training instabilities", arXiv 2309.14322, lrs 3e-4..3e-1)
reproduce large-scale instabilities in small models. An early layer's MLP ``down_proj`` output (Qwen3-MoE: its eager
experts' down projections) grows in a few channels, as Sun et al. 2024's massive activations (arXiv 2402.17762),
past 65504 in float32 within 7-20 steps; the attention logits stay under 90 (Qwen3 and Gemma3 normalize q and k),
the output logits under 75 and the MoE router's logits under 350. In float16 the first steps train alike natively
and under ampsafe; once the forward overflows, natively every later step is skipped and the scale halves to the
end; ``ampsafe run`` reaches its floor 16 steps later, heals the module it names and trains. How the workload was
found, per step and per place: bench/trl_fp16_growth.py, its results in bench/results/trl_fp16_growth.md. At the
fine-tuning lrs users set (TRL's SFT default 2e-5, LoRA's 2e-4) and at nanoGPT's 1e-3 for baby networks nothing
grows near 65504 there.

The workload ``default init`` (GRPO only: HF's initializer_range 0.02, nothing near the edge), checks that
GRPO's generation and training under ``ampsafe run`` match native and float32.

``python -m bench.trl_fp16 [--steps N] [--grown-steps N] [--models ...] [--trainers sft grpo] [--ranks 1 2]
[--suites edge grown "default init"] [--keep]`` writes bench/results/trl_fp16.{md,json} (``--keep``: with the
rows of the suites not run kept from the JSON already there).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, machine, machine_tag, write_result

TESTS = Path(__file__).resolve().parent.parent / "tests" / "trl"
SCRIPTS = TESTS / "scripts"
MODELS = ("qwen3", "gemma3", "qwen3_moe")
TRAINERS = {"sft": "sft_train.py", "grpo": "grpo_train.py"}
RUNS = ("fp32", "native", "ampsafe")
SUITES = ("edge", "grown", "default init")
GROWN_STEPS = 40  # Qwen3's float16 forward first overflows at step 10, the floor of 1 is reached 16 steps later


def _tiny_lm():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import tiny_lm

    return tiny_lm


def edge_args(model: str) -> tuple[str, ...]:
    """tests/trl/scripts/tiny_lm.py's ``EDGE_ARGS``: the init (and an MoE's eager experts) at float16's edge."""
    return ("--model", model, *_tiny_lm().EDGE_ARGS[model])


def grown_args(model: str) -> tuple[str, ...]:
    """tests/trl/scripts/tiny_lm.py's ``GROWN_ARGS``: the width and lr at which SFT grows the overflow."""
    return ("--model", model, *_tiny_lm().GROWN_ARGS[model])


def script_args(suite: str, model: str) -> tuple[str, ...]:
    if suite == "edge":
        return edge_args(model)
    return grown_args(model) if suite == "grown" else ("--model", model)


def command(run: str, script: str, args: tuple, steps: int, ranks: int, out: Path, port: int) -> list[str]:
    """One run's command line: ``fp32`` is the plain script (accelerate on a CPU ignores ``fp16=True`` and trains
    in float32: the reference losses), ``native`` and ``ampsafe`` as in the module docstring."""
    script_line = [str(SCRIPTS / script), *args, "--steps", str(steps), "--out", str(out / "trainer")]
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(port)]
    if run == "fp32":
        return [*launch, *script_line]
    if run == "native":
        return [*launch, str(TESTS / "native.py"), "--scales", str(out / "scales-{rank}.json"), *script_line]
    ampsafe = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--report", str(out / "report"), "--"]
    return [*ampsafe, *launch, *script_line]


def _history(out: Path) -> list[dict]:
    path = out / "trainer" / "trainer_state.json"
    if not path.exists():
        return []
    return [e for e in json.loads(path.read_text())["log_history"] if "loss" in e]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summarize(run: str, out: Path, proc: subprocess.CompletedProcess, seconds: float) -> dict:
    history = _history(out)
    result = {
        "returncode": proc.returncode,
        "seconds": round(seconds, 1),
        "steps_logged": len(history),
        "losses": [e["loss"] for e in history],
        "grad_norms": [e.get("grad_norm") for e in history],
        # HF's logging_nan_inf_filter logs a non-finite loss as the running mean (0.0 from the start): the
        # grad norm, computed from the same step's gradients, says which steps were non-finite
        "nonfinite_steps": sum(1 for e in history if not _finite(e.get("grad_norm"))),
        "error": _error(proc) if proc.returncode else "",
        "per_rank": [],
    }
    if run == "fp32":
        pass
    elif run == "native":
        for path in sorted(out.glob("scales-*.json")):
            updates = json.loads(path.read_text())
            skipped = [i for i, (before, after) in enumerate(updates) if after < before]
            result["per_rank"].append(
                {"steps": len(updates), "skipped": len(skipped), "final_scale": updates[-1][1] if updates else None}
            )
    else:
        for path in sorted((out / "report").rglob("report.json")):
            report = json.loads(path.read_text())
            for s in (s for s in report["scalers"] if s["total_steps"]):
                heals = [{"step": h["step"], "paths": h["paths"][:3]} for h in s["heal_records"]]
                result["per_rank"].append(
                    {
                        "steps": s["total_steps"],
                        "skipped": s["skipped_steps"],
                        "floor_hits": s["floor_hits"],
                        "final_scale": s["scale"],
                        "heals": heals,
                    }
                )
        result["amp_keys_logged"] = sum(1 for e in history if "amp/loss_scale" in e)
    return result


def _error(proc: subprocess.CompletedProcess) -> str:
    """The last line of the run's output naming an error (torch.distributed.run ends with a banner)."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
    return (lines[-1] if lines else f"exit {proc.returncode}").strip()[:300]


def run_one(run: str, script: str, args: tuple, steps: int, ranks: int, port: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="trl-fp16-") as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        proc = subprocess.run(
            command(run, script, args, steps, ranks, out, port), capture_output=True, text=True, cwd=out
        )
        return summarize(run, out, proc, time.perf_counter() - start)


def _cell(r: dict) -> str:
    if r["returncode"] and not r["steps_logged"]:
        return f"exit {r['returncode']}: `{r['error'][:140]}`"
    parts = []
    for k in r["per_rank"]:
        part = f"{k['skipped']}/{k['steps']} skipped, final scale {k['final_scale']:g}"
        if k.get("heals"):
            part += f", healed at step {k['heals'][0]['step']}: `{k['heals'][0]['paths'][0]}`"
        parts.append(part)
    trained = [x for x, g in zip(r["losses"], r["grad_norms"]) if _finite(g)]
    losses = f"trained-step losses {trained[0]:.2f} -> {trained[-1]:.2f}" if trained else "no trained step"
    return "; ".join([*parts, f"non-finite steps {r['nonfinite_steps']}/{r['steps_logged']}", losses])


def plan_runs(args) -> list[tuple[str, str, str, int]]:
    """(suite, trainer, model, ranks) of each row: the edge on both trainers (SFT on 2 ranks for the first model),
    the grown overflow on SFT alike, HF's default init on GRPO."""
    plan = []
    for ranks in args.ranks:
        for trainer in args.trainers:
            if ranks > 1 and trainer == "grpo":
                continue  # GRPO runs on one rank here
            models = args.models if ranks == 1 else args.models[:1]
            plan += [("edge", trainer, m, ranks) for m in models if "edge" in args.suites]
            if trainer == "sft":
                plan += [("grown", trainer, m, ranks) for m in models if "grown" in args.suites]
    if "grpo" in args.trainers and 1 in args.ranks and "default init" in args.suites:
        plan += [("default init", "grpo", m, 1) for m in args.models]
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--grown-steps", type=int, default=GROWN_STEPS)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=list(TRAINERS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument("--keep", action="store_true", help="keep the rows of the suites not run from the JSON")
    args = parser.parse_args()
    rows = []
    port = 29650
    today = time.strftime("%Y-%m-%d", time.gmtime())
    for suite, trainer, model, ranks in plan_runs(args):
        steps = args.grown_steps if suite == "grown" else args.steps
        for run in RUNS:
            port += 1
            result = run_one(run, TRAINERS[trainer], script_args(suite, model), steps, ranks, port)
            row = {"suite": suite, "trainer": trainer, "model": model, "ranks": ranks, "run": run, "steps": steps}
            rows.append({**row, "date": today, **result})
            print(suite, trainer, model, ranks, run, _cell(result), flush=True)
    data = {"machine": machine(), "steps": args.steps, "grown_steps": args.grown_steps, "rows": rows}
    path = RESULTS / "trl_fp16.json"
    if args.keep and path.exists():
        old = json.loads(path.read_text())
        kept = [r for r in old["rows"] if r["suite"] not in args.suites]
        data = {**old, "grown_steps": args.grown_steps, "rows": kept + rows}
    data["edge_args"] = {m: edge_args(m) for m in MODELS}
    data["grown_args"] = {m: grown_args(m) for m in MODELS}
    write_result("trl_fp16", data, markdown(data))


def markdown(data: dict) -> str:
    """The table of every row (suites in order), each row's note once below it, then the module docstring."""
    rows = sorted(data["rows"], key=lambda r: SUITES.index(r["suite"]))
    dates = sorted({r.get("date", data["machine"]["date"]) for r in rows})
    lines = [
        "# TRL fp16: native torch GradScaler vs `ampsafe run`",
        "",
        f"Machine: {machine_tag(data['machine'])}; dates {', '.join(dates)}; optimizer steps per run: "
        f"{data['steps']} (edge, default init), {data.get('grown_steps', '-')} (grown); script arguments per model: "
        f"edge {json.dumps({m: a[2:] for m, a in data['edge_args'].items()})}, grown "
        f"{json.dumps({m: a[2:] for m, a in data.get('grown_args', {}).items()})}; lr: TRL's defaults (SFT 2e-5, "
        "GRPO 1e-6) but where the arguments set one. Float16 emulated on the CPU (`--emulate-fp16`; native: "
        "tests/trl/native.py). Wall times are load-inflated (a 2-core machine shared with other jobs).",
        "",
        "| workload | trainer | model | ranks | run | per rank; steps | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for r in rows:
        mark = ""
        if r.get("note"):
            if r["note"] not in notes:
                notes.append(r["note"])
            mark = "*" * (notes.index(r["note"]) + 1)
        cells = (r["suite"], r["trainer"], r["model"], r["ranks"], r["run"], _cell(r), f"{r['seconds']}{mark}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [""] + ["\\*" * (i + 1) + f" {note}\n" for i, note in enumerate(notes)]
    lines += [(__doc__ or "").split("\n\n", 1)[1].strip()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
