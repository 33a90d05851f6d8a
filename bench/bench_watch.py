"""Overhead of ``ampsafe.watch(guard=True)`` on a training step: torchvision resnet18, batch 8, CPU.

Guard mode must cost at most 3% of a step (a large model would hide any overhead, so the issue fixes this one).
Baseline and guarded steps are interleaved in one run (same machine load), each timed as a median.
"""

from __future__ import annotations

import statistics
import time

import torch
import torchvision

import ampsafe
from bench.common import write_result

__all__ = ["run"]


def _setup(batch: int, image: int):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(0, 10, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    return model, opt, x, y, loss_fn


def run(suite: str = "quick") -> dict:
    pairs = 7 if suite == "quick" else 15
    batch, image = 8, 224
    model, opt, x, y, loss_fn = _setup(batch, image)

    def plain_step():
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    watcher = ampsafe.watch(model, guard=True)

    def guarded_step():
        loss = loss_fn(model(x), y)
        loss.backward()
        if watcher.check(loss, replay=lambda: loss_fn(model(x), y)):
            opt.step()
        opt.zero_grad()

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    torch.set_num_threads(1)  # 2 shared cores under load: two OpenMP threads thrash and bury the signal
    plain_step()  # warm-up
    base, guard = [], []
    with watcher:
        guarded_step()
        for i in range(pairs):  # interleaved, alternating order, so load drifts hit both alike
            order = (plain_step, guarded_step) if i % 2 == 0 else (guarded_step, plain_step)
            for fn in order:
                (base if fn is plain_step else guard).append(timed(fn))
        # the guard's own work, timed alone (snapshot + fused check), for the record
        loss = loss_fn(model(x), y)
        loss.backward()
        t0 = time.perf_counter()
        for _ in range(5):
            watcher._snapshot = watcher._take_snapshot()
            watcher.check(loss)
        check_ms = (time.perf_counter() - t0) / 5 * 1e3
        opt.zero_grad()
    full = []  # for the record: full hooks on every step (what guard mode avoids)
    with ampsafe.watch(model, backward=True):
        for _ in range(3):
            full.append(timed(plain_step))
    mb, mg = statistics.median(base), statistics.median(guard)
    mf = statistics.median(full)
    overhead = mg / mb - 1.0
    data = {
        "model": "torchvision resnet18 (weights=None, 10 classes)",
        "batch": batch,
        "image": image,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "pairs": pairs,
        "step_s_median": mb,
        "guarded_step_s_median": mg,
        "overhead": overhead,
        "guard_work_ms": check_ms,
        "full_watch_step_s_median": mf,
        "full_watch_ratio": mf / mb,
        "step_s_all": base,
        "guarded_step_s_all": guard,
        "budget": 0.03,
        "within_budget": overhead <= 0.03,
    }
    md = (
        "| resnet18 b8 224px CPU | median step (s) |\n|---|---|\n"
        f"| plain | {mb:.4f} |\n| watch(guard=True) + check() | {mg:.4f} |\n"
        f"| watch() full hooks (median of 3, for reference) | {mf:.4f} ({mf / mb:.2f}x) |\n\n"
        f"Overhead: **{overhead * 100:+.2f}%** (budget 3%), median of {pairs} interleaved steps each; the guard's "
        f"own work (snapshot + fused loss/grad-norm check, one host sync) is {check_ms:.2f} ms per step "
        f"({check_ms / 1e3 / mb * 100:.2f}% of a step).\n"
    )
    write_result("watch", data, md)
    print(md)
    return data


if __name__ == "__main__":
    run()
