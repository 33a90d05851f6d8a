"""Overhead of ``ampsafe run``'s FP32 guard on a resnet18 FP32 CPU step (batch 8, 224 px, SGD momentum).

    .venv/bin/python tests/run/bench_guard_overhead.py [--rounds 9]

Installs ``ampsafe.auto`` in process (as ``ampsafe run`` does in its child), then times interleaved steps
with the guard on and off (``guard.enabled``: off, the wrapped ``step`` passes straight through), and the
guard's own check (fused gradient + loss check, one host sync) alone. Not a test: prints a markdown table.

Measured 2026-12-01 on the project's 2-core CPU while other sessions loaded it (load average 7-10): the check
alone took 2.9 ms (min of 60) / 8.3 ms (median), i.e. 0.27% / 0.78% of the idle resnet18 b8 step that
bench/results/watch.md measured (1.064 s). The interleaved whole-step A/B swung between -20% and +12% under that
load, so only the check's own time is a number; rerun this on an idle machine for the step-level figure.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import ampsafe.auto as auto

auto.install(quiet=True)

import torch  # noqa: E402
import torchvision  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    (guard,) = [g for g in auto._state["guards"] if g.backend.name == "torch"]
    x, y = torch.randn(args.batch, 3, 224, 224), torch.randint(0, 1000, (args.batch,))

    def step() -> float:
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return time.perf_counter() - t0

    for _ in range(2):  # warm up both paths
        guard.enabled = True
        step()
        guard.enabled = False
        step()
    on, off = [], []
    for i in range(args.rounds):
        for enabled in (True, False) if i % 2 else (False, True):
            guard.enabled = enabled
            (on if enabled else off).append(step())
    guard.enabled = True
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    checks = []
    for _ in range(20):
        t0 = time.perf_counter()
        assert guard._finite(optimizer, loss.detach())
        checks.append(time.perf_counter() - t0)
    assert guard.total_steps >= args.rounds and guard.skipped_steps == 0
    m_on, m_off, m_check = statistics.median(on), statistics.median(off), statistics.median(checks)
    print(
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}\n"
    )
    print(f"| resnet18 b{args.batch} 224px CPU FP32 | median step (s), {args.rounds} interleaved rounds |")
    print("|---|---|")
    print(f"| guard off (wrapped step passes through) | {m_off:.4f} |")
    print(f"| guard on | {m_on:.4f} |")
    print(
        f"\nOverhead: **{100 * (m_on / m_off - 1):+.2f}%** per step (budget 1%); the guard's check alone "
        f"(fused gradient + loss check, one host sync): {1000 * m_check:.2f} ms, {100 * m_check / m_off:.2f}% of a step"
    )


if __name__ == "__main__":
    main()
