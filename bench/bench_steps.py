"""Seconds per FP32 training step of each reference workload at its default size.

One step = forward (with the workload's own loss) + backward + optimizer step on a pre-made batch; batches
are made before timing (they are synthetic), and each timed step uses a different one. Median of the timed
steps after warmup steps. The load average and the process CPU time per step are recorded too, because the
CPU may be shared with other jobs (wall time then overstates the cost).
"""

from __future__ import annotations

import os
import statistics
import time

try:
    from bench.common import write_result
except ImportError:  # run as a script: python bench/bench_steps.py
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.common import write_result

# label -> (workload name, build options)
CASES = {
    "frcnn": ("frcnn", {}),
    "ppyolo tiny": ("ppyolo", {"config": "tiny"}),
    "ppyolo r50vd_dcn (reduced)": ("ppyolo", {"config": "r50vd_dcn"}),
    "dbnet": ("dbnet", {}),
}
FULL_ONLY = {"frcnn resnet50": ("frcnn", {"backbone": "resnet50"})}
LR = {"frcnn": 0.01, "ppyolo": 2e-4, "dbnet": 1e-3}


def _sizes(w) -> str:
    size = getattr(w, "image_size", None)
    batch = getattr(w, "batch_size", None)
    return f"{size} px x {batch}" if size else f"batch {batch}"


def time_steps(name: str, options: dict, *, warmup: int, repeats: int) -> dict:
    """Build workload ``name`` and time ``warmup + repeats`` training steps on distinct batches."""
    from ampsafe_lab.workloads import build

    sync = None
    if name == "frcnn":
        import torch

        if torch.cuda.is_available():
            options, sync = dict(options, device="cuda"), torch.cuda.synchronize
    w = build(name, seed=0, **options)
    optimizer = w.make_optimizer(LR.get(name, 1e-3))
    batches = [w.batch(step) for step in range(warmup + repeats)]
    if w.framework == "torch":

        def step(batch):
            optimizer.zero_grad()
            loss = w.loss(batch)
            loss.backward()
            optimizer.step()
            return float(loss.detach())

    else:

        def step(batch):
            loss = w.loss(batch)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            return float(loss.detach())

    times, cpu_times, losses = [], [], []
    for i, batch in enumerate(batches):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step(batch))
        if sync:
            sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    return {
        "workload": name,
        "options": options,
        "framework": w.framework,
        "size": _sizes(w),
        "seconds_per_step": statistics.median(times),
        "cpu_seconds_per_step": statistics.median(cpu_times),
        "times": times,
        "losses": losses,
    }


def run(suite: str = "quick") -> dict:
    warmup, repeats = (2, 5) if suite == "quick" else (3, 10)
    cases = dict(CASES, **(FULL_ONLY if suite == "full" else {}))
    results, skipped = {}, {}
    for label, (name, options) in cases.items():
        try:
            results[label] = time_steps(name, options, warmup=warmup, repeats=repeats)
        except Exception as exc:  # a workload that cannot be built here (e.g. not written yet) is reported
            skipped[label] = f"{type(exc).__name__}: {exc}"
        print(label, results.get(label, {}).get("seconds_per_step", skipped.get(label)), flush=True)
    data = {
        "suite": suite,
        "warmup": warmup,
        "repeats": repeats,
        "loadavg_1min": os.getloadavg()[0],
        "steps": results,
        "skipped": skipped,
    }
    lines = [
        f"Seconds per FP32 training step (forward + loss + backward + optimizer step), median of {repeats} "
        f"steps on distinct batches after {warmup} warmup steps; 1-min load average at the end "
        f"{data['loadavg_1min']:.1f} (the CPU may be shared).",
        "",
        "| workload | framework | input | s/step | CPU s/step |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['framework']} | {r['size']} | {r['seconds_per_step']:.3f} | {r['cpu_seconds_per_step']:.3f} |"
        )
    for label, why in skipped.items():
        lines.append(f"| {label} | - | - | not run: {why} | - |")
    write_result("steps", data, "\n".join(lines))
    return data


if __name__ == "__main__":
    import sys

    run(sys.argv[1] if len(sys.argv) > 1 else "quick")
