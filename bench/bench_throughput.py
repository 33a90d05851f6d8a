"""Training throughput (images/s) of torch ``frcnn`` per AMP mode, ratios measured in the same run.

Modes: FP32, bf16 autocast, float16 autocast + torch GradScaler, float16 + ampsafe island policy + ampsafe's
floored GradScaler. One measured step = zero_grad + forward with the loss + (scaled) backward + optimizer step
on a pre-made batch; median of the measured steps after warm-up steps; each mode starts from the same seeded
weights.

On a CPU this proves nothing about ampsafe: torch's CPU bfloat16 autocast is real AMP (AMX / AVX512-BF16 kernels)
while CPU float16 autocast is slower than FP32, so an island's overhead there is recorded, not claimed. The GPU
numbers come from ``bench/gpu.sh``. Paddle has no float16 CPU kernels (its float16 here is emulated), so no Paddle
row is a speed and none is reported here; the emulator's cost is in ``emulator.md``.

``time_modes`` is shared with ``bench/gpu_bench.py`` (same step, same modes, on CUDA).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable

try:
    from bench.common import RESULTS, write_result
except ImportError:  # run as a script: python bench/bench_throughput.py
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.common import RESULTS, write_result

__all__ = ["MODES", "Case", "frcnn_case", "resnet50_case", "time_modes", "ratios", "run"]

MODES = ("fp32", "bf16", "fp16", "fp16+island")
SUITES = {
    "quick": {"cases": [("frcnn mobilenet", "mobilenet", 160, 2)], "warmup": 2, "repeats": 5},
    "full": {
        "cases": [("frcnn mobilenet", "mobilenet", 320, 2), ("frcnn resnet50", "resnet50", 320, 1)],
        "warmup": 2,
        "repeats": 7,
    },
    "smoke": {"cases": [("frcnn mobilenet", "mobilenet", 64, 1)], "warmup": 1, "repeats": 2},
}


class Case:
    """What one throughput case needs: a fresh seeded model + loss per mode, its batches and example inputs."""

    def __init__(self, name: str, build: Callable[[], tuple], images_per_batch: int, description: str):
        self.name = name
        self.build = build  # () -> (model, loss_fn(batch), batches, example_inputs)
        self.images_per_batch = images_per_batch
        self.description = description


def frcnn_case(name: str, backbone: str, image_size: int, batch_size: int, device: str, n_batches: int = 4) -> Case:
    def build():
        from ampsafe_lab.workloads import build as build_workload

        w = build_workload(
            "frcnn", seed=0, backbone=backbone, image_size=image_size, batch_size=batch_size, device=device
        )
        return w.model, w.loss, [w.batch(i) for i in range(n_batches)], w.example_inputs

    return Case(name, build, batch_size, f"torchvision Faster R-CNN {backbone} FPN, {image_size} px x {batch_size}")


def resnet50_case(batch_size: int, device: str, image_size: int = 224) -> Case:
    def build():
        import torch
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.resnet50(weights=None).to(device).train()
        gen = torch.Generator(device="cpu").manual_seed(0)
        batches = [
            (
                torch.randn(batch_size, 3, image_size, image_size, generator=gen).to(device),
                torch.randint(0, 1000, (batch_size,), generator=gen).to(device),
            )
            for _ in range(2)
        ]

        def loss_fn(batch):
            return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

        return model, loss_fn, batches, (batches[0][0],)

    return Case("resnet50", build, batch_size, f"torchvision ResNet-50, {image_size} px x {batch_size}, cross-entropy")


def _timed_steps(case: Case, mode: str, device: str, warmup: int, repeats: int, lr: float) -> dict:
    import torch

    import ampsafe
    from ampsafe.torch import GradScaler

    model, loss_fn, batches, example_inputs = case.build()
    notes = ""
    if mode == "fp16+island":
        scanned = ampsafe.scan(model, example_inputs, level="O1", target=device)  # this device's autocast lists
        report = ampsafe.patch(model, example_inputs, policy="island", level="O1", report=scanned)
        notes = f"{len(report.patched)} modules islanded"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    if mode == "fp16":
        scaler = torch.amp.GradScaler(device)
    elif mode == "fp16+island":
        scaler = GradScaler(device, min_scale=1.0, on_floor="clamp")
    else:
        scaler = torch.amp.GradScaler(device, enabled=False)
    dtype = {"bf16": torch.bfloat16}.get(mode, torch.float16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype, enabled=mode != "fp32"):
            loss = loss_fn(batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    times, losses = [], []
    for i in range(warmup + repeats):
        sync()
        t0 = time.perf_counter()
        loss = step(batches[i % len(batches)])
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    seconds = statistics.median(times)
    return {
        "mode": mode,
        "seconds_per_step": seconds,
        "images_per_s": case.images_per_batch / seconds,
        "times": times,
        "losses": losses,
        "final_scale": float(scaler.get_scale()),
        "notes": notes,
    }


def time_modes(
    case: Case, device: str, *, modes=MODES, warmup: int = 2, repeats: int = 5, lr: float = 0.01, log=print
) -> list[dict]:
    """Images/s of ``case`` in each mode (fresh seeded model each); a mode that fails records its error."""
    rows = []
    for mode in modes:
        try:
            row = _timed_steps(case, mode, device, warmup, repeats, lr)
        except Exception as exc:  # noqa: BLE001 - e.g. a dtype without kernels on this device: report it
            row = {"mode": mode, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        row["case"] = case.name
        rows.append(row)
        shown = row.get("error") or f"{row['images_per_s']:.2f} images/s ({row['seconds_per_step']:.3f} s/step)"
        log(f"  {case.name} {mode}: {shown}")
    return rows


def ratios(rows: list[dict]) -> dict:
    """Throughput ratios within one case: each mode vs FP32, and islands vs unpatched float16."""
    speed = {r["mode"]: r.get("images_per_s") for r in rows}
    out = {}
    if speed.get("fp32"):
        out.update({f"{m}/fp32": s / speed["fp32"] for m, s in speed.items() if s and m != "fp32"})
    if speed.get("fp16") and speed.get("fp16+island"):
        out["fp16+island/fp16"] = speed["fp16+island"] / speed["fp16"]
    return out


def markdown_table(rows: list[dict]) -> str:
    lines = ["| case | mode | images/s | s/step | vs FP32 | notes |", "|---|---|---|---|---|---|"]
    by_case: dict[str, list[dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r)
    for case, mine in by_case.items():
        rel = ratios(mine)
        for r in mine:
            if r.get("error"):
                lines.append(f"| {case} | {r['mode']} | - | - | - | failed: {r['error']} |")
                continue
            vs = (
                "1.00x"
                if r["mode"] == "fp32"
                else (f"{rel[r['mode'] + '/fp32']:.2f}x" if r["mode"] + "/fp32" in rel else "-")
            )
            lines.append(
                f"| {case} | {r['mode']} | {r['images_per_s']:.2f} | {r['seconds_per_step']:.3f} | {vs} | {r.get('notes', '')} |"
            )
        if "fp16+island/fp16" in rel:
            lines.append(f"| {case} | island / unpatched fp16 | {rel['fp16+island/fp16']:.3f}x | | | |")
    return "\n".join(lines)


def cpu_flags() -> list[str]:
    """The CPU's low-precision matrix features (they decide whether CPU autocast has fast kernels)."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return sorted(words & {"amx_bf16", "amx_fp16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f"})


def run(suite: str = "quick") -> dict:
    import torch

    plan = SUITES[suite]
    data = {
        "suite": suite,
        "device": "cpu",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_flags": cpu_flags(),
        "warmup": plan["warmup"],
        "repeats": plan["repeats"],
        "loadavg_1min_start": os.getloadavg()[0],
        "cases": {},
        "rows": [],
    }
    for name, backbone, size, batch in plan["cases"]:
        case = frcnn_case(name, backbone, size, batch, "cpu")
        print(f"[throughput] {case.description}", flush=True)
        rows = time_modes(
            case, "cpu", warmup=plan["warmup"], repeats=plan["repeats"], log=lambda s: print(s, flush=True)
        )
        data["cases"][name] = {"description": case.description, "ratios": ratios(rows)}
        data["rows"] += rows
    data["loadavg_1min_end"] = os.getloadavg()[0]
    write_throughput(data)
    return data


def write_throughput(data: dict) -> None:
    """Markdown + plot of ``run``'s data (separate so a saved JSON can be re-rendered without re-measuring)."""
    ratio_lines = []
    for name, c in data["cases"].items():
        rel = c["ratios"]
        got = ", ".join(f"{k} {v:.2f}x" for k, v in rel.items())
        ratio_lines.append(f"- {name}: {c['description']}; ratios: {got}")
    md = [
        f"Training throughput on CPU (torch {data.get('torch', '?')}, {data['torch_threads']} threads), images/s = "
        f"batch / median step time over {data['repeats']} steps after {data['warmup']} warm-up steps; ratios from "
        f"this run. 1-min load average {data['loadavg_1min_start']:.1f} at the start, {data['loadavg_1min_end']:.1f} "
        "at the end (2 shared cores). CPU features: " + (", ".join(data.get("cpu_flags", [])) or "unknown") + ".",
        "",
        "**Read this before the numbers:** on a CPU, torch bfloat16 autocast runs real bfloat16 kernels (oneDNN, "
        "AMX / AVX512-BF16 where the CPU has them) while float16 autocast is slower than FP32 (measured below), so "
        "the island overhead measured here says nothing about a GPU: it is recorded, not claimed. GPU throughput "
        "comes from `bench/gpu.sh`. Paddle float16 on CPU is emulated (no kernels), so no Paddle row is reported "
        "as a speed (the emulator's cost is in `emulator.md`).",
        "",
        *ratio_lines,
        "",
        markdown_table(data["rows"]),
    ]
    topic = "throughput" if data["suite"] == "quick" else f"throughput-{data['suite']}"
    try:
        from bench.plots import plot_throughput

        png = plot_throughput(
            data["rows"], RESULTS / f"{topic}.png", "frcnn training throughput on CPU (not a GPU claim)"
        )
        md += ["", f"![throughput]({png.name})"]
    except Exception as exc:  # noqa: BLE001 - a missing plot must not lose the numbers
        data["plot_error"] = f"{type(exc).__name__}: {exc}"
    write_result(topic, data, "\n".join(md))


if __name__ == "__main__":
    import sys

    run(sys.argv[1] if len(sys.argv) > 1 else "quick")
