"""What ``ampsafe run``'s headroom sampling costs: a sampled step against an unwatched one, and per step at the
default interval (``--headroom-every 10``: a sampled step in 10, after the first 10).

The sampler (:class:`ampsafe.run.headroom.HeadroomSampler`) on an ampsafe scaler, as the run attaches it: forward
hooks on the tracked modules (the paths one scan found) keep each output's abs-max on the device, read with one host
sync at the scaler's update with the unscaled gradient norm. Steps are timed round by round, unwatched and sampled
back to back in alternating order; the cost is the median of the paired ratios. One thread, timed by the process's
CPU time (``time.process_time``) beside the wall time: on a shared machine another process's load moves the wall
time of a step by more than the sampling costs, and not the CPU time this process spends.

* resnet18 (torchvision, random init), batch 8, 112 px, SGD momentum, FP32 forward under ``ampsafe.torch.GradScaler``;
* dbnet (PaddleOCR det_mv3_db, the demo's model), batch 8, 128 px, Adam, FP32 forward under
  ``ampsafe.paddle.GradScaler`` (no emulator: the emulator's slower step would make the sampling look cheaper).

    python -m bench.bench_headroom [--rounds 9]

Writes bench/results/headroom.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from .common import machine, write_result

DEFAULT_EVERY = 10


class _Bench:
    """One model's step with a sampler the bench arms (sampled) or leaves detached (unwatched)."""

    def __init__(self, scaler, step, sampler_cls) -> None:
        self.scaler, self.step = scaler, step
        self.sampler = sampler_cls(scaler, 1, say=lambda _line: None)
        self.sample = False
        self.next = 0
        scaler.add_step_callback(self._on_step)

    def _on_step(self, decision) -> None:
        self.next = decision.step + 1
        if self.sample or self.sampler.monitor is None or not self.sampler.monitor.how:
            self.sampler.on_step(self.scaler, decision)
        self.sampler.close()  # the next step arms itself (or not)

    def run(self, sample: bool) -> float:
        self.sample = sample
        if sample and self.sampler.monitor is not None and self.sampler.monitor.layers:
            self.sampler.monitor.arm(self.next)
        t0, c0 = time.perf_counter(), time.process_time()
        self.step()
        return time.process_time() - c0, time.perf_counter() - t0


def _measure(bench: _Bench, rounds: int) -> dict:
    for _ in range(3):  # warm up; the first updates choose the tracked modules (one scan)
        bench.run(True)
        bench.run(False)
    assert bench.sampler.monitor.how == "scan", bench.sampler.monitor.how
    samples_before = bench.sampler.monitor.samples
    cpu: dict[str, list[float]] = {"unwatched": [], "sampled": []}
    wall: dict[str, list[float]] = {"unwatched": [], "sampled": []}
    for i in range(rounds):
        for variant in ("unwatched", "sampled") if i % 2 == 0 else ("sampled", "unwatched"):
            c, w = bench.run(variant == "sampled")
            cpu[variant].append(c)
            wall[variant].append(w)
    assert bench.sampler.monitor.samples - samples_before == rounds

    def pct(times):
        return 100 * (statistics.median(s / u for s, u in zip(times["sampled"], times["unwatched"])) - 1)

    return {
        "rounds": rounds,
        "tracked_modules": len(bench.sampler.monitor.layers),
        "median_step_cpu_s": {v: statistics.median(t) for v, t in cpu.items()},
        "median_step_wall_s": {v: statistics.median(t) for v, t in wall.items()},
        "sampled_step_pct": pct(cpu),
        "per_step_pct_at_default_every": pct(cpu) / DEFAULT_EVERY,
        "sampled_step_pct_wall": pct(wall),
        "all_steps_cpu_s": cpu,
        "all_steps_wall_s": wall,
    }


def resnet18(rounds: int) -> dict:
    import torch
    import torchvision

    from ampsafe.run.headroom import HeadroomSampler
    from ampsafe.torch import GradScaler

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = GradScaler("cpu", init_scale=256.0)
    x, y = torch.randn(8, 3, 112, 112), torch.randint(0, 1000, (8,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    out = _measure(_Bench(scaler, step, HeadroomSampler), rounds)
    return {"model": "resnet18 b8 112px FP32, SGD momentum, ampsafe.torch.GradScaler", **out}


def dbnet(rounds: int) -> dict:
    import ampsafe_lab.workloads
    from ampsafe.paddle import GradScaler
    from ampsafe.run.headroom import HeadroomSampler

    w = ampsafe_lab.workloads.build("dbnet", seed=0, image_size=128, batch_size=8)
    opt = w.make_optimizer(1e-3)
    scaler = GradScaler(init_loss_scaling=256.0, emulated=True)
    batch = w.batch(0)

    def step() -> None:
        loss = w.loss(batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()

    out = _measure(_Bench(scaler, step, HeadroomSampler), rounds)
    return {"model": "dbnet (det_mv3_db) b8 128px FP32, Adam, ampsafe.paddle.GradScaler", **out}


def _markdown(results: dict) -> str:
    lines = [
        f"Headroom sampling (`ampsafe run --headroom-every {DEFAULT_EVERY}`, the default): a sampled step against "
        "an unwatched one, paired round by round (median of the ratios); per step at the default interval = the "
        f"sampled step's cost / {DEFAULT_EVERY}. Goal: at most 1% of a step.",
        "",
        "| model | tracked modules | unwatched step, CPU s | sampled step, CPU s | sampled step | per step at N=10 "
        "| sampled step, wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        med = r["median_step_cpu_s"]
        lines.append(
            f"| {r['model']} | {r['tracked_modules']} | {med['unwatched']:.3f} | {med['sampled']:.3f} | "
            f"{r['sampled_step_pct']:+.1f}% | {r['per_step_pct_at_default_every']:+.2f}% | "
            f"{r['sampled_step_pct_wall']:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_headroom", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", nargs="*", choices=("resnet18", "dbnet"), default=("resnet18", "dbnet"))
    args = parser.parse_args(argv)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # before Paddle starts its thread pools
    import torch

    torch.set_num_threads(1)
    info = machine()
    results = {name: {"resnet18": resnet18, "dbnet": dbnet}[name](args.rounds) for name in args.only}
    md = _markdown(results)
    write_result("headroom", {"machine": info, "threads": 1, **results}, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
