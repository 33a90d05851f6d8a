"""What ``ampsafe run``'s gradient-underflow sampling costs: a sampled step with the underflow measured against the
same sampled step with it off (``--no-underflow``), and per step at the default interval (``--headroom-every 10``:
a sampled step in 10, after the first 10).

The measurement (:func:`ampsafe.core.underflow.measure_underflow`, through the run's
:meth:`~ampsafe.run.headroom.HeadroomSampler.before_unscale`, called as the run's scaler class calls it, before
the unscale): a float32 host copy of every gradient, its float16 rounding and a histogram of the exponents. Steps
are timed round by round, off and on back to back in alternating order; the cost is the median of the paired ratios.
Timed by the process's CPU time beside the wall time: on a shared machine another process's load moves the wall
time of a step by more than the measurement costs.

* resnet18 (torchvision, random init, 11.7M parameters), batch 8, 112 px, SGD momentum, ``ampsafe.torch.GradScaler``;
* dbnet (PaddleOCR det_mv3_db, the demo's model), batch 8, 128 px, Adam, ``ampsafe.paddle.GradScaler``.

    python -m bench.underflow_cost [--rounds 9]

Writes bench/results/underflow_cost.{json,md}, with ``lscpu | head`` of the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from .common import write_result

DEFAULT_EVERY = 10


class _Bench:
    """One model's step under a sampler whose underflow measurement the bench turns on or off per step."""

    def __init__(self, scaler, step) -> None:
        from ampsafe.run.headroom import HeadroomSampler

        self.scaler, self.step = scaler, step
        self.sampler = HeadroomSampler(scaler, 1, say=lambda _line: None)
        self.series = self.sampler.underflow
        scaler.add_step_callback(lambda decision: self.sampler.on_step(scaler, decision))

    def before_unscale(self) -> None:
        self.sampler.before_unscale(self.scaler)

    def run(self, measure: bool) -> tuple[float, float]:
        self.sampler.underflow = self.series if measure else None
        c0, w0 = time.process_time(), time.perf_counter()
        self.step(self.before_unscale)
        return time.process_time() - c0, time.perf_counter() - w0


def _measure(bench: _Bench, rounds: int) -> dict:
    for _ in range(2):  # warm up (the first updates choose the tracked modules: one scan)
        bench.run(True)
        bench.run(False)
    before = len(bench.series.samples)
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    wall: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(rounds):
        for variant in ("off", "on") if i % 2 == 0 else ("on", "off"):
            c, w = bench.run(variant == "on")
            cpu[variant].append(c)
            wall[variant].append(w)
    assert len(bench.series.samples) - before == rounds, "every 'on' step measured once"

    def ratio(times):
        return statistics.median(s / u for s, u in zip(times["on"], times["off"]))

    latest = bench.series.latest
    return {
        "rounds": rounds,
        "gradient_elements": latest.elements,
        "median_step_cpu_s": {v: statistics.median(t) for v, t in cpu.items()},
        "median_step_wall_s": {v: statistics.median(t) for v, t in wall.items()},
        "sampled_step_ratio_cpu": ratio(cpu),
        "per_step_pct_at_default_every": 100 * (ratio(cpu) - 1) / DEFAULT_EVERY,
        "sampled_step_ratio_wall": ratio(wall),
        "latest": latest.to_dict(),
        "all_steps_cpu_s": cpu,
        "all_steps_wall_s": wall,
    }


def resnet18(rounds: int) -> dict:
    import torch
    import torchvision

    from ampsafe.torch import GradScaler

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = GradScaler("cpu", init_scale=256.0)
    x, y = torch.randn(8, 3, 112, 112), torch.randint(0, 1000, (8,))

    def step(before_unscale) -> None:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        before_unscale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    out = _measure(_Bench(scaler, step), rounds)
    return {"model": "resnet18 b8 112px, CPU float16 autocast, SGD momentum, ampsafe.torch.GradScaler", **out}


def dbnet(rounds: int) -> dict:
    import ampsafe_lab.workloads
    from ampsafe.paddle import GradScaler

    w = ampsafe_lab.workloads.build("dbnet", seed=0, image_size=128, batch_size=8)
    opt = w.make_optimizer(1e-3)
    scaler = GradScaler(init_loss_scaling=256.0, emulated=True)
    batch = w.batch(0)

    def step(before_unscale) -> None:
        loss = w.loss(batch)
        scaler.scale(loss).backward()
        before_unscale()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()

    out = _measure(_Bench(scaler, step), rounds)
    return {"model": "dbnet (det_mv3_db) b8 128px FP32, Adam, ampsafe.paddle.GradScaler", **out}


def _lscpu() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"lscpu failed: {exc}"
    return "\n".join(text.splitlines()[:10])


def _markdown(results: dict, lscpu: str) -> str:
    lines = [
        "Gradient-underflow sampling (`ampsafe run`, on by default; `--no-underflow` turns it off): a sampled step "
        "with the underflow measured against the same step without, paired round by round (median of the CPU-time "
        f"ratios); per step at the default interval = (ratio - 1) / {DEFAULT_EVERY}.",
        "",
        "| model | gradient elements | step off, CPU s | step on, CPU s | added per sampled step, CPU ms "
        "| sampled step (on/off) | per step at N=10 | sampled step, wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["models"]:
        cpu = r["median_step_cpu_s"]
        lines.append(
            f"| {r['model']} | {r['gradient_elements']:,} | {cpu['off']:.3f} | {cpu['on']:.3f} "
            f"| {1000 * (cpu['on'] - cpu['off']):.0f} | {r['sampled_step_ratio_cpu']:.3f}x "
            f"| +{r['per_step_pct_at_default_every']:.2f}% | {r['sampled_step_ratio_wall']:.3f}x |"
        )
    lines += [
        "",
        "The measurement's work grows with the gradient elements (a float32 host copy, a float16 rounding and an "
        "exponent histogram each), and the added time is a difference of two noisy medians. These CPU steps are "
        "slow (resnet18 under CPU float16 autocast), so the same milliseconds are a larger share of a GPU step, where "
        "the host copy also crosses the bus: measure there before relying on the ratio.",
        "",
        f"{results['rounds']} rounds per model, in one run, one thread. Machine (`lscpu | head`):",
        "",
        "```",
        lscpu,
        "```",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--render", metavar="JSON", help="only write the markdown again from a results JSON")
    args = parser.parse_args(argv)
    if args.render:
        import json

        results = json.loads(open(args.render).read())
        write_result("underflow_cost", results, _markdown(results, results["lscpu"]))
        return
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # one thread: before Paddle starts its pools
    import torch

    torch.set_num_threads(1)
    lscpu = _lscpu()
    results = {"rounds": args.rounds, "lscpu": lscpu, "models": [resnet18(args.rounds), dbnet(args.rounds)]}
    jpath, mpath = write_result("underflow_cost", results, _markdown(results, lscpu))
    print(mpath.read_text())


if __name__ == "__main__":
    main()
