"""The torch part of ``ampsafe bench --suite full`` on one CUDA GPU (run by ``bench/gpu.sh``; PyTorch only).

Sections, in order of importance, each under a shared time budget (what does not fit is skipped and said so;
results are rewritten after every section so a timeout still leaves them):

1. throughput, images/s of a training step: ``frcnn`` mobilenet and resnet50 FPN and torchvision ResNet-50 in
   FP32 / float16 autocast + torch GradScaler / float16 + ampsafe islands + ampsafe GradScaler / bf16 autocast
   (same step and modes as ``bench/bench_throughput.py``), with the issue's targets checked: islands >= 0.95x
   unpatched float16 and >= 1.5x FP32 on frcnn-r50;
2. the emulator fidelity test's CUDA half: ``tests/paddle/fidelity_case.py``'s torch run under CUDA float16
   autocast (Paddle cannot run here, so the emulator's side is the CPU test's): step and layer of the first
   overflow, compared with the same run under CPU float16 autocast;
3. accuracy: ``frcnn`` COCO mAP@0.5 per mode with ``bench_accuracy``'s recipe (``ampsafe_lab.demo.run_torch``).

``--dry-run`` runs every section at toy sizes on whatever device there is (CPU included) to prove the script
executes; its numbers mean nothing. Results: ``gpu-bench.json`` / ``.md`` (``gpu-dry-run.*`` for a dry run)
in ``$OUT/bench/results`` when ``$OUT`` is set, else ``bench/results``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main", "PLAN", "DRY_PLAN"]

# frcnn-r50 at 512 px x 4 is the headline throughput case; resnet50 the classic AMP reference.
PLAN = {
    "throughput": [
        ("frcnn mobilenet", {"kind": "frcnn", "backbone": "mobilenet", "image_size": 320, "batch_size": 8}),
        ("frcnn resnet50", {"kind": "frcnn", "backbone": "resnet50", "image_size": 512, "batch_size": 4}),
        ("resnet50", {"kind": "resnet50", "image_size": 224, "batch_size": 128}),
    ],
    "warmup": 5,
    "repeats": 10,
    "fidelity_steps": 40,
    "accuracy_seeds": (0, 1, 2),
    "accuracy_modes": ("fp32", "bf16", "native", "island"),
}
# frcnn accuracy on the GPU: a CPU cannot train Faster R-CNN from random init to mAP@0.5 0.5 (bench_accuracy's
# FRCNN_CPU_NOTE: 0.15 after 160 steps at 128 px x 4); a GPU step is ~20-50x faster, so train longer. Seeds run
# seed-major, so the budget cuts whole seeds. Untested on a GPU so far: if FP32 stays under 0.5, raise steps.
GPU_FRCNN = {"image_size": 128, "batch_size": 8, "lr": 0.02, "steps": 800, "level": "O1", "eval_images": 64}
DRY_PLAN = {
    "throughput": [
        ("frcnn mobilenet", {"kind": "frcnn", "backbone": "mobilenet", "image_size": 64, "batch_size": 1}),
        ("resnet50", {"kind": "resnet50", "image_size": 32, "batch_size": 2}),
    ],
    "warmup": 1,
    "repeats": 2,
    "fidelity_steps": 3,
    "accuracy_seeds": (0,),
    "accuracy_modes": ("fp32", "island"),
    "accuracy_recipe": {"steps": 2, "eval_images": 2, "image_size": 64, "batch_size": 1},
}
TARGETS = {"fp16+island/fp16": 0.95, "fp16+island/fp32 (frcnn resnet50)": 1.5}


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def log(msg: str) -> None:
    print(msg, flush=True)


_checkpoints: list = []  # main() puts the results writer here; sections call checkpoint() after each item


def checkpoint() -> None:
    """Rewrite the results so far (a hard timeout then still leaves every finished item on disk)."""
    for save in _checkpoints:
        save()


def environment(device: str) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    for name in ("torchvision", "numpy", "pycocotools"):
        info[name] = _version(name)
    return info


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return getattr(__import__(module), "__version__", "installed")
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not fatal
        return f"broken ({type(exc).__name__})"


def section_throughput(plan: dict, device: str, budget: Budget, out: dict) -> None:
    from bench.bench_throughput import frcnn_case, ratios, resnet50_case, time_modes

    rows = out.setdefault("throughput", {"rows": [], "ratios": {}, "skipped": []})
    for name, spec in plan["throughput"]:
        if budget.left() < 60:
            rows["skipped"].append(f"{name}: out of time budget")
            continue
        if spec["kind"] == "frcnn":
            case = frcnn_case(name, spec["backbone"], spec["image_size"], spec["batch_size"], device)
        else:
            case = resnet50_case(spec["batch_size"], device, image_size=spec["image_size"])
        log(f"[throughput] {case.description}")
        mine = time_modes(
            case,
            device,
            modes=("fp32", "fp16", "fp16+island", "bf16"),
            warmup=plan["warmup"],
            repeats=plan["repeats"],
            log=log,
        )
        for r in mine:
            r["description"] = case.description
        rows["rows"] += mine
        rows["ratios"][name] = ratios(mine)
        checkpoint()
    checks = {}
    for name, rel in rows["ratios"].items():
        if "fp16+island/fp16" in rel:
            checks[f"{name}: fp16+island/fp16 >= 0.95"] = rel["fp16+island/fp16"] >= TARGETS["fp16+island/fp16"]
    r50 = rows["ratios"].get("frcnn resnet50", {})
    if "fp16+island/fp32" in r50:
        checks["frcnn resnet50: fp16+island/fp32 >= 1.5"] = r50["fp16+island/fp32"] >= 1.5
    rows["target_checks"] = checks


def section_fidelity(plan: dict, device: str, budget: Budget, out: dict) -> None:
    """fidelity_case's torch half (numpy + torch only) on this device vs on the CPU."""
    sys.path.insert(0, str(ROOT / "tests" / "paddle"))
    import fidelity_case as fc

    steps, lr = plan["fidelity_steps"], 1e-3
    result = {"steps": steps, "lr": lr}
    for label, kwargs in (
        ("forward", {"steps": steps, "scale": 2.0**16}),
        ("scaled_gradient", {"steps": 3, "scale": 2.0**20}),
    ):
        n = kwargs.pop("steps")
        here = fc.run_torch(n, lr=lr, device=device, **kwargs)
        cpu = fc.run_torch(n, lr=lr, device="cpu", **kwargs)
        result[label] = {
            "scale": kwargs["scale"],
            "device": device,
            "on_device": _overflow_summary(here),
            "cpu": _overflow_summary(cpu),
            "same_first_overflow": _overflow_summary(here) == _overflow_summary(cpu),
            "records_on_device": here,
            "records_cpu": cpu,
        }
        log(f"[fidelity] {label}: {device} {_overflow_summary(here)} | cpu {_overflow_summary(cpu)}")
    result["note"] = (
        "tests/paddle/test_fidelity.py -m gpu compares this CUDA history with ampsafe.paddle.emulate_fp16; Paddle "
        "is not installed here, so the emulator side is the CPU run of the same test (equal to torch CPU autocast)."
    )
    out["fidelity"] = result


def _overflow_summary(records: list[dict]) -> dict:
    last = records[-1] if records else {}
    overflowed = bool(last.get("forward") or last.get("backward"))
    return {
        "steps_run": len(records),
        "first_overflow_step": len(records) - 1 if overflowed else None,
        "where": (last.get("forward"), tuple(last.get("backward") or ())) if overflowed else None,
    }


def section_accuracy(plan: dict, device: str, budget: Budget, out: dict) -> None:
    from ampsafe_lab.demo import run_torch
    from bench.bench_accuracy import TORCH_LABELS, mode_table

    recipe = dict(GPU_FRCNN, **plan.get("accuracy_recipe", {}))
    steps, eval_images = recipe["steps"], recipe["eval_images"]
    runs, skipped = [], []
    out["accuracy"] = {
        "recipe": dict(recipe, device=device),
        "runs": runs,
        "table": [],
        "markdown": "",
        "skipped": skipped,
    }
    longest = 0.0
    for seed in plan["accuracy_seeds"]:
        for mode in plan["accuracy_modes"]:
            if budget.left() < max(45.0, 1.3 * longest + 10):
                skipped.append(f"{mode} seed {seed}")
                continue
            record = {"mode": mode, "seed": seed, "steps": steps, "metric": None}
            trained: list = []
            t0 = time.perf_counter()
            try:
                trace = run_torch(
                    mode,
                    steps=steps,
                    lr=recipe["lr"],
                    level=recipe["level"],
                    seed=seed,
                    image_size=recipe["image_size"],
                    batch_size=recipe["batch_size"],
                    workload_out=trained,
                    device=device,
                )
                record.update(trace.summary())
                record["metric"] = float(trained[0].evaluate(n_images=eval_images)["map50"])
            except Exception as exc:  # noqa: BLE001 - a failed mode is a result
                record["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            record["wall_seconds"] = round(time.perf_counter() - t0, 1)
            longest = max(longest, record["wall_seconds"])
            runs.append(record)
            out["accuracy"]["table"], out["accuracy"]["markdown"] = mode_table(
                runs, metric="map50", labels=TORCH_LABELS
            )
            checkpoint()
            log(f"[accuracy] frcnn {mode} seed {seed}: map50 {record['metric']} {record.get('error', '')}")


def markdown(out: dict) -> str:
    env = out["environment"]
    lines = [
        f"# GPU bench{' (DRY RUN: toy sizes, numbers mean nothing)' if out['dry_run'] else ''}",
        "",
        f"Device: {env.get('gpu') or env['device']}; torch {env['torch']} (CUDA {env['cuda']}), torchvision "
        f"{env['torchvision']}, pycocotools {env['pycocotools']}; {env['date']}; took {out.get('seconds', '?')} s.",
        "",
    ]
    tp = out.get("throughput")
    if tp:
        from bench.bench_throughput import markdown_table

        lines += ["## Throughput (training step, images/s; median after warm-up; ratios from this run)", ""]
        lines += sorted({f"- {r['case']}: {r['description']}" for r in tp["rows"] if r.get("description")})
        lines += ["", markdown_table(tp["rows"]), ""]
        for check, ok in tp.get("target_checks", {}).items():
            lines.append(f"- target {check}: {'met' if ok else 'NOT met'}")
        lines += [f"- skipped: {s}" for s in tp.get("skipped", [])] + [""]
    fid = out.get("fidelity")
    if fid:
        lines += ["## Emulator fidelity, CUDA half (torch only)", ""]
        for label in ("forward", "scaled_gradient"):
            if label in fid:
                f = fid[label]
                lines.append(
                    f"- {label} (scale {f['scale']:g}): {f['device']} {f['on_device']}, cpu {f['cpu']}; same: "
                    f"{f['same_first_overflow']}"
                )
        lines += ["", fid["note"], ""]
    acc = out.get("accuracy")
    if acc:
        r = acc["recipe"]
        lines += [
            "## Accuracy: frcnn COCO mAP@0.5 on held-out synthetic shapes",
            "",
            f"{r['steps']} steps, SGD lr {r['lr']:g}, {r['image_size']} px x {r['batch_size']}, evaluated on "
            f"{r['eval_images']} images in FP32.",
            "",
            acc["markdown"],
        ]
        if acc["skipped"]:
            lines.append(f"\nNot run (time budget): {', '.join(acc['skipped'])}")
    for name, err in out.get("errors", {}).items():
        lines.append(f"\n**{name} failed:** {err}")
    return "\n".join(lines) + "\n"


def write(out: dict, results: Path, stem: str) -> tuple[Path, Path]:
    results.mkdir(parents=True, exist_ok=True)
    jpath, mpath = results / f"{stem}.json", results / f"{stem}.md"
    jpath.write_text(json.dumps(out, indent=2, default=str) + "\n")
    mpath.write_text(markdown(out))
    return jpath, mpath


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on any device (CPU too): proves it runs")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds for all sections together (default 420)")
    ap.add_argument("--only", nargs="*", choices=["throughput", "fidelity", "accuracy"], help="sections to run")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        log("gpu_bench: torch is not importable with this Python; set PYTHON=/path/to/python that has torch")
        return 2
    if torch.cuda.is_available():
        device = "cuda"
        torch.backends.cudnn.benchmark = True
    elif args.dry_run:
        device = "cpu"
        torch.set_num_threads(1)
    else:
        log(
            "gpu_bench: torch.cuda.is_available() is False (torch "
            f"{torch.__version__}, built for CUDA {torch.version.cuda}); this script needs a CUDA GPU. "
            "Use --dry-run to check it on a CPU."
        )
        return 2
    plan = DRY_PLAN if args.dry_run else PLAN
    results = Path(os.environ["OUT"]) / "bench" / "results" if os.environ.get("OUT") else ROOT / "bench" / "results"
    stem = "gpu-dry-run" if args.dry_run else "gpu-bench"
    budget = Budget(args.budget_s)
    started = time.perf_counter()
    out: dict = {"dry_run": args.dry_run, "environment": environment(device), "errors": {}}
    log(f"gpu_bench: {out['environment']}")
    _checkpoints.append(lambda: write(out, results, stem))
    sections = {"throughput": section_throughput, "fidelity": section_fidelity, "accuracy": section_accuracy}
    needs_vision = {"throughput", "accuracy"}
    for name in args.only or list(sections):
        if name in needs_vision and out["environment"]["torchvision"] is None:
            out["errors"][name] = "torchvision is not installed with this torch: frcnn and resnet50 need it"
        elif name == "accuracy" and out["environment"]["pycocotools"] is None:
            out["errors"][name] = "pycocotools is not installed: COCO mAP needs it"
        elif budget.left() < 30:
            out["errors"][name] = "skipped: time budget spent"
        else:
            t0 = time.perf_counter()
            try:
                sections[name](plan, device, budget, out)
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others
                out["errors"][name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
                log(traceback.format_exc())
            log(f"[{name}] {time.perf_counter() - t0:.0f} s")
        out["seconds"] = round(time.perf_counter() - started, 1)
        jpath, mpath = write(out, results, stem)
    log("\n" + mpath.read_text())
    log(f"wrote {jpath} and {mpath}")
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
