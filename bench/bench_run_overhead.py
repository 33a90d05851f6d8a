"""What keeping a script alive costs: the FP32 guard and the input capture per step, and the floor's replay.

resnet18 (torchvision, random init), batch 8, SGD momentum, on this CPU:

* **guard / capture** (FP32, 224 px): ``ampsafe.auto`` installed in process, as ``ampsafe run`` does in its
  child; steps with the guard off (``guard.enabled = False``: the wrapped ``step`` and the model's forward hook
  pass straight through), on (the step check, and the snapshot a skip restores from at the first forward), on,
  and on with an :class:`~ampsafe.core.capture.InputCapture` of the model (what every ampsafe scaler and the
  guard under ``--watch`` keep), interleaved round by round so that machine load hits all three alike. Budget:
  1% of a step. The guard's own check (fused gradient + loss check, one host sync) is timed alone too.
* **floor replay** (float16 autocast, ``--replay-size`` px): ``ampsafe.torch.GradScaler``'s ``measure_floor``
  (the sentinel replay of the captured batch, plus a float32 forward of the named module when the forward
  overflowed) against the median of that training step: a one-off cost at the floor, not per step.

    python -m bench.bench_run_overhead [--rounds 9] [--replay-size 112]

Writes bench/results/run_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time

from .common import machine, write_result

VARIANTS = ("off", "guard", "guard+capture")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def guard_overhead(rounds: int, batch: int) -> dict:
    import ampsafe.auto as auto  # as ``ampsafe run`` does in its child: installed before torch is used

    auto.install(quiet=True)
    import torch
    import torchvision

    from ampsafe._framework import backend_of
    from ampsafe.core.capture import InputCapture

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    from ampsafe.run.session import current

    (guard,) = [g for g in current().guards if g.backend.name == "torch"]
    x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
    capture: list = []

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if capture:
            capture[0].drop()  # as a scaler does after each update()

    def run(variant: str) -> float:
        guard.enabled = variant != "off"
        if variant == "guard+capture" and not capture:
            capture.append(InputCapture(backend_of(model), model))
        elif variant != "guard+capture" and capture:
            capture.pop().remove()
        return _timed(step)

    for variant in VARIANTS:  # warm up every path
        run(variant)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]  # rotate which variant goes first
        for variant in order:
            times[variant].append(run(variant))
    guard.enabled = True
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    checks = [_timed(lambda: guard._finite(optimizer, loss.detach())) for _ in range(30)]
    snapshots = [_timed(lambda: backend_of(model).snapshot(model)) for _ in range(30)]
    assert guard.skipped_steps == 0
    hook_us = _capture_hook_us(backend_of, InputCapture)
    median = {v: statistics.median(t) for v, t in times.items()}
    # paired per round: each round's three steps ran back to back, so the ratio cancels slow drifts of load
    paired = {v: statistics.median(a / b for a, b in zip(times[v], times["off"])) for v in VARIANTS if v != "off"}
    return {
        "model": f"resnet18 b{batch} 224px FP32, SGD momentum",
        "rounds": rounds,
        "median_step_s": median,
        "overhead_pct_paired": {v: 100 * (r - 1) for v, r in paired.items()},
        "overhead_pct_medians": {v: 100 * (median[v] / median["off"] - 1) for v in VARIANTS if v != "off"},
        "check_ms_min": 1000 * min(checks),
        "check_ms_median": 1000 * statistics.median(checks),
        "check_pct_of_step": 100 * statistics.median(checks) / median["off"],
        "snapshot_ms_median": 1000 * statistics.median(snapshots),
        "snapshot_pct_of_step": 100 * statistics.median(snapshots) / median["off"],
        "capture_hook_us": hook_us,
        "capture_hook_pct_of_step": 100 * hook_us * 1e-6 / median["off"],
        "all_steps_s": times,
    }


def _capture_hook_us(backend_of, InputCapture, n: int = 20000) -> float:
    """The capture's cost per forward: a 1-parameter module's forward with and without it, best of 3."""
    import torch

    tiny, one = torch.nn.Linear(1, 1), torch.ones(1, 1)

    def per_call() -> float:
        return min(_timed(lambda: [tiny(one) for _ in range(n)]) for _ in range(3)) / n

    with torch.no_grad():
        bare = per_call()
        capture = InputCapture(backend_of(tiny), tiny)
        hooked = per_call()
        capture.remove()
    return 1e6 * (hooked - bare)


def floor_replay(rounds: int, batch: int, size: int) -> dict:
    import torch
    import torchvision

    from ampsafe.core.scale import FloorInfo
    from ampsafe.torch import GradScaler

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    scaler = GradScaler("cpu", init_scale=2.0**10)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    step()  # resolves the model and attaches the capture
    steps = [_timed(step) for _ in range(rounds)]
    info = FloorInfo(0, ("fc.weight",), ("fc",), 1.0, (1.0,), False)

    def forward() -> None:  # a captured forward, as the floor sees it
        with torch.autocast("cpu", dtype=torch.float16):
            model(x)

    forward()
    backward_case = [_timed(lambda: scaler.measure_floor(info)) for _ in range(3)]
    verdict_backward = scaler.measure_floor(info)
    with torch.no_grad():
        model.fc.weight.mul_(1e6)  # the last layer's output now passes 65504 in float16
    forward()
    forward_case = [_timed(lambda: scaler.measure_floor(info)) for _ in range(3)]
    verdict_forward = scaler.measure_floor(info)
    step_s = statistics.median(steps)
    return {
        "model": f"resnet18 b{batch} {size}px, CPU float16 autocast, ampsafe.torch.GradScaler",
        "step_s_median": step_s,
        "replay_backward_verdict_s": statistics.median(backward_case),
        "replay_backward_x_step": statistics.median(backward_case) / step_s,
        "replay_forward_verdict_s": statistics.median(forward_case),
        "replay_forward_x_step": statistics.median(forward_case) / step_s,
        "verdict_backward": verdict_backward.text,
        "verdict_forward": verdict_forward.text,
    }


def to_markdown(info: dict, guard: dict, replay: dict) -> str:
    med, paired = guard["median_step_s"], guard["overhead_pct_paired"]
    lines = [
        "`ampsafe run`: per-step cost of the FP32 guard and the input capture, and the floor's one-off replay "
        "(`python -m bench.bench_run_overhead`).",
        "",
        f"## Per step: {guard['model']}, {guard['rounds']} interleaved rounds (budget 1%)",
        "",
        "| variant | median step (s) | overhead, paired per round | overhead, of medians |",
        "|---|---|---|---|",
        f"| off (no guard, no capture) | {med['off']:.4f} | - | - |",
    ]
    for v in ("guard", "guard+capture"):
        lines.append(f"| {v} | {med[v]:.4f} | {paired[v]:+.2f}% | {guard['overhead_pct_medians'][v]:+.2f}% |")
    lines += [
        "",
        f"The guard's own check (fused gradient + loss check, one host sync): {guard['check_ms_median']:.2f} ms "
        f"median, {guard['check_ms_min']:.2f} ms min: {guard['check_pct_of_step']:.2f}% of a step. The snapshot a "
        "skip restores from (every buffer of the model, BatchNorm running statistics and counts, copied at the "
        f"step's first forward): {guard['snapshot_ms_median']:.2f} ms median, {guard['snapshot_pct_of_step']:.2f}% "
        "of a step (in the guard rows). The capture "
        f"keeps a reference to the forward's arguments (one pre-hook, no copies): {guard['capture_hook_us']:.1f} us "
        f"per forward ({guard['capture_hook_pct_of_step']:.4f}% of a step). On a shared 2-core VM single steps vary "
        "by +-15%, so the whole-step rows bound the overhead by that noise; the check and the hook, timed alone, "
        "are the overhead itself.",
        "",
        f"## At the floor (once): {replay['model']}",
        "",
        "| replay | seconds | x one training step |",
        "|---|---|---|",
        f"| one training step (median) | {replay['step_s_median']:.3f} | 1 |",
        f"| forward finite (backward verdict: the sentinel replay) | {replay['replay_backward_verdict_s']:.3f} | "
        f"{replay['replay_backward_x_step']:.2f} |",
        f"| forward overflows (sentinel replay + float32 forward for the magnitude) | "
        f"{replay['replay_forward_verdict_s']:.3f} | {replay['replay_forward_x_step']:.2f} |",
        "",
        f"Verdicts: backward case: {replay['verdict_backward']}; forward case: {replay['verdict_forward']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_run_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--replay-size", type=int, default=112, help="image size of the float16 replay case")
    args = parser.parse_args(argv)
    info = machine()
    guard = guard_overhead(args.rounds, args.batch)
    replay = floor_replay(max(3, args.rounds // 2), args.batch, args.replay_size)
    md = to_markdown(info, guard, replay)
    write_result("run_overhead", {"machine": info, "guard": guard, "replay": replay}, md)
    print(md)
    return 0


def run(suite: str = "quick") -> None:
    """The ``python -m bench`` topic: the same run for every suite."""
    main([])


if __name__ == "__main__":
    raise SystemExit(main())
