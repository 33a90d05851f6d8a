"""Benchmark of ``ampsafe.patch``: its own cost on frcnn (scan included) and what patched models cost to run.

- ``patch()`` wall time on frcnn (torchvision Faster R-CNN, mobilenet FPN), scan included, policies auto/island.
- CPU bfloat16-autocast train-step throughput of frcnn, island-patched / unpatched (recorded only: island
  overhead is a GPU claim, float16 on a GPU).
- DBNet (Paddle, FP32 on CPU) forward throughput with ``rescale`` and ``rewrite`` / unpatched.
All ratios of one run on one machine.
"""

from __future__ import annotations

import os
import time

from bench.common import median_time, write_result


def _time_once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _frcnn(suite: str) -> dict:
    import torch

    import ampsafe
    import ampsafe_lab.workloads

    repeats = 2 if suite == "quick" else 5
    work = ampsafe_lab.workloads.build("frcnn", seed=0)
    model, inputs = work.model, work.example_inputs
    out: dict = {"frcnn_image_size": work.image_size, "frcnn_batch_size": work.batch_size}
    scan_times, own_times = [], []
    for _ in range(repeats):
        scan_times.append(_time_once(lambda: ampsafe.scan(model, inputs)))
    report = ampsafe.scan(model, inputs)
    for _ in range(repeats):
        ampsafe.unpatch(model)
        own_times.append(_time_once(lambda: ampsafe.patch(model, policy="island", report=report)))
    out["scan_s"] = sorted(scan_times)[len(scan_times) // 2]
    out["patch_island_given_report_s"] = sorted(own_times)[len(own_times) // 2]
    for policy in ("auto", "island"):
        times = []
        for _ in range(repeats):
            ampsafe.unpatch(model)
            times.append(_time_once(lambda policy=policy: ampsafe.patch(model, inputs, policy=policy)))
        out[f"patch_{policy}_s"] = sorted(times)[len(times) // 2]
        out[f"patch_{policy}_modules"] = len(ampsafe.patching.patched_modules(model))
    ampsafe.unpatch(model)

    small = ampsafe_lab.workloads.build("frcnn", seed=0, image_size=160, batch_size=1)
    batch = small.batch(0)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = small.loss(batch)
        loss.backward()
        small.model.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    plain_s, _ = median_time(step, repeats=repeats + 1, warmup=1)
    ampsafe.patch(small.model, small.example_inputs, policy="island")
    torch.manual_seed(0)
    island_s, _ = median_time(step, repeats=repeats + 1, warmup=1)
    ampsafe.unpatch(small.model)
    out.update(
        {
            "bf16_step_image_size": 160,
            "bf16_step_unpatched_s": plain_s,
            "bf16_step_island_s": island_s,
            "bf16_throughput_ratio_island": plain_s / island_s,
        }
    )
    return out


def _dbnet(suite: str) -> dict:
    import paddle

    import ampsafe
    from ampsafe_lab.workloads.dbnet.brink import brink_workload

    repeats = 3 if suite == "quick" else 7
    work = brink_workload(seed=0)
    model, x = work.model, work.example_inputs[0]
    model.eval()

    def forward():
        with paddle.no_grad():
            model(x)

    out = {}
    base, _ = median_time(forward, repeats=repeats)
    out["dbnet_forward_unpatched_s"] = base
    for policy in ("rescale", "rewrite"):
        model.train()
        ampsafe.patch(model, work.example_inputs, policy=policy)
        model.eval()
        patched, _ = median_time(forward, repeats=repeats)
        ampsafe.unpatch(model)
        out[f"dbnet_forward_{policy}_s"] = patched
        out[f"dbnet_throughput_ratio_{policy}"] = base / patched
    return out


def run(suite: str = "quick") -> dict:
    data = {"suite": suite}
    data.update(_frcnn(suite))
    data.update(_dbnet(suite))
    md = [
        "| measurement | value |",
        "|---|---|",
        f"| `patch(policy='auto')` on frcnn {data['frcnn_image_size']}px x{data['frcnn_batch_size']}, scan included "
        f"| {data['patch_auto_s']:.2f} s ({data['patch_auto_modules']} modules patched) |",
        f"| `patch(policy='island')` on frcnn, scan included | {data['patch_island_s']:.2f} s "
        f"({data['patch_island_modules']} modules) |",
        f"| of which `ampsafe.scan` alone | {data['scan_s']:.2f} s |",
        f"| `patch(policy='island', report=...)`: patch's own cost | {data['patch_island_given_report_s'] * 1e3:.1f} ms |",
        f"| frcnn CPU bf16-autocast train step ({data['bf16_step_image_size']}px x1), unpatched | "
        f"{data['bf16_step_unpatched_s']:.2f} s |",
        f"| same, island-patched | {data['bf16_step_island_s']:.2f} s |",
        f"| throughput ratio island / unpatched (CPU bf16, recorded, no claim) | "
        f"{data['bf16_throughput_ratio_island']:.3f} |",
        f"| DBNet brink FP32 forward, unpatched | {data['dbnet_forward_unpatched_s']:.3f} s |",
        f"| throughput ratio rescale / unpatched | {data['dbnet_throughput_ratio_rescale']:.3f} |",
        f"| throughput ratio rewrite / unpatched | {data['dbnet_throughput_ratio_rewrite']:.3f} |",
    ]
    load = os.getloadavg()[0]
    note = (
        f"\n\nOne run; 1-minute load average {load:.1f} at the end (the cores may be shared), so absolute times "
        "are noisy. Target: `patch()` on frcnn, scan included, under 5 s on CPU; nearly all of it is the scan. The "
        ">= 0.95x island throughput claim is for float16 on a GPU; CPU bf16 ratios are recorded, not claimed.\n"
    )
    write_result("patch", data, "\n".join(md) + note)
    return data


if __name__ == "__main__":
    run()
