"""Measure (not a test): the floor replay's cost vs one training step, and the input capture's per-step overhead.

resnet18 (torchvision, random init), batch 8, 3x224x224, CPU float16 autocast, SGD, ampsafe.torch.GradScaler.
    .venv/bin/python tests/heal/bench_floor_replay.py [--rounds 15]
Steps with and without the capture are interleaved (A/B per round) so machine load hits both alike; medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torchvision

from ampsafe.core.scale import FloorInfo
from ampsafe.torch import GradScaler


def step(model, opt, scaler, x, y) -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)
    x, y = torch.randn(8, 3, 224, 224), torch.randint(0, 10, (8,))
    with_capture = GradScaler("cpu", init_scale=2.0**10)
    without = GradScaler("cpu", init_scale=2.0**10)
    for _ in range(2):  # warm up; the first step resolves the model and attaches the capture
        step(model, opt, with_capture, x, y)
        step(model, opt, without, x, y)
    without.capture.remove()  # same hooks as before the capture existed
    on, off = [], []
    for r in range(args.rounds):
        pair = [lambda: step(model, opt, with_capture, x, y), lambda: step(model, opt, without, x, y)]
        first, second = (0, 1) if r % 2 == 0 else (1, 0)
        times = {first: timed(pair[first]), second: timed(pair[second])}
        on.append(times[0])
        off.append(times[1])
    ratio = statistics.median(a / b for a, b in zip(on, off))

    # the hook alone: a forward of a 1-parameter module with and without the capture, many times
    tiny = torch.nn.Linear(1, 1)
    t1 = torch.ones(1, 1)
    n = 20000
    with torch.no_grad():
        bare = min(timed(lambda: [tiny(t1) for _ in range(n)]) for _ in range(3)) / n
        from ampsafe._framework import backend_named
        from ampsafe.core.capture import InputCapture

        cap = InputCapture(backend_named("torch"), tiny, state=None)
        hooked_plain = min(timed(lambda: [tiny(t1) for _ in range(n)]) for _ in range(3)) / n
        cap.remove()
        from ampsafe.torch.scaler import _autocast_state

        cap = InputCapture(backend_named("torch"), tiny, state=_autocast_state)
        hooked = min(timed(lambda: [tiny(t1) for _ in range(n)]) for _ in range(3)) / n
        cap.remove()

    # the floor's replay: what measure_floor costs (sentinel replay, plus a float32 forward when it finds one)
    step_s = statistics.median(off)
    with torch.autocast("cpu", dtype=torch.float16):
        model(x)  # a captured forward, as the floor sees it
    info = FloorInfo(0, ("fc.weight",), ("fc",), 1.0, (1.0,), False)
    clean = [timed(lambda: with_capture.measure_floor(info)) for _ in range(3)]
    verdict_clean = with_capture.measure_floor(info)
    with torch.no_grad():
        model.fc.weight.mul_(1e6)  # the last layer's output now passes 65504 in float16
    with torch.autocast("cpu", dtype=torch.float16):
        model(x)
    hot = [timed(lambda: with_capture.measure_floor(info)) for _ in range(3)]
    verdict_hot = with_capture.measure_floor(info)
    out = {
        "step_s_median": step_s,
        "capture_step_ratio_median": ratio,
        "capture_overhead_pct": 100 * (ratio - 1),
        "hook_cost_us": 1e6 * (hooked - bare),
        "hook_cost_plain_us": 1e6 * (hooked_plain - bare),
        "hook_cost_pct_of_step": 100 * (hooked - bare) / step_s,
        "replay_backward_verdict_s": statistics.median(clean),
        "replay_backward_verdict_x_step": statistics.median(clean) / step_s,
        "replay_forward_verdict_s": statistics.median(hot),
        "replay_forward_verdict_x_step": statistics.median(hot) / step_s,
        "verdict_backward": verdict_clean.text,
        "verdict_forward": verdict_hot.text,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
