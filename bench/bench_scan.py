"""Cost of ``ampsafe.scan`` against one FP32 forward+backward of the same model and batch.

Targets (issue 5): scan time <= 3x and peak memory <= 1.5x one forward+backward, on ``frcnn`` (torchvision
fasterrcnn_mobilenet_v3_large_320_fpn, batch 2, 320 px, train mode with targets) and ``dbnet`` (Paddle,
the workload's batch). Each case runs in its own process; peak memory is the peak resident set size above
the level after the model was built and warmed up, sampled every 2 ms while the measured call runs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import threading
import time

from bench.common import write_result

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


class _PeakRSS:
    """Peak RSS above the level at entry, sampled by a thread."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.delta = self.peak - self.base


def _frcnn_case():
    import torch
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=5).train()
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 320, 320, generator=g) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 120.0, 150.0]]), "labels": torch.tensor([1])} for _ in range(2)]

    def fwd_bwd():
        loss = sum(model(images, targets).values())
        loss.backward()
        model.zero_grad(set_to_none=True)

    return model, (images, targets), fwd_bwd, (lambda out: sum(out.values()))


def _dbnet_case():
    import ampsafe_lab.workloads

    w = ampsafe_lab.workloads.build("dbnet", seed=0)
    batch = w.batch(0)
    inputs = (batch[0],)

    def fwd_bwd():
        loss = w.loss(batch)
        loss.backward()
        w.model.clear_gradients()

    def loss_fn(out):
        return w.loss_fn(out, batch)["loss"]

    return w.model, inputs, fwd_bwd, loss_fn


def _measure(case: str, what: str, repeats: int, queue) -> None:
    import ampsafe

    model, inputs, fwd_bwd, loss_fn = {"frcnn": _frcnn_case, "dbnet": _dbnet_case}[case]()
    if what == "fwd_bwd":
        fn = fwd_bwd
    elif what == "scan":

        def fn():
            ampsafe.scan(model, inputs)
    else:  # scan with the backward measured

        def fn():
            ampsafe.scan(model, inputs, loss_fn=loss_fn, loss_scale=2.0**16)

    fwd_bwd()  # warm up allocators and kernels the same way for every variant
    with _PeakRSS() as mem:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    queue.put({"seconds": statistics.median(times), "times": times, "peak_mb": mem.delta / 2**20})


def _run_isolated(case: str, what: str, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(case, what, repeats, queue))
    proc.start()
    result = queue.get(timeout=1800)
    proc.join()
    return result


def run(suite: str = "quick") -> dict:
    repeats = 3 if suite == "quick" else 7
    data = {"suite": suite, "repeats": repeats, "cases": {}}
    lines = [
        "| model | fwd+bwd s | scan s | time ratio (target <= 3) | fwd+bwd peak MB | scan peak MB | memory ratio "
        "(target <= 1.5) | scan+backward s | its time ratio | its memory ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in ("frcnn", "dbnet"):
        try:
            base = _run_isolated(case, "fwd_bwd", repeats)
            scan = _run_isolated(case, "scan", repeats)
            full = _run_isolated(case, "scan_loss", repeats)
        except Exception as exc:  # a missing workload is recorded, not fatal
            data["cases"][case] = {"error": f"{type(exc).__name__}: {exc}"}
            lines.append(f"| {case} | error: {exc} |")
            continue
        entry = {
            "fwd_bwd": base,
            "scan": scan,
            "scan_with_backward": full,
            "time_ratio": scan["seconds"] / base["seconds"],
            "memory_ratio": scan["peak_mb"] / base["peak_mb"],
            "time_ratio_with_backward": full["seconds"] / base["seconds"],
            "memory_ratio_with_backward": full["peak_mb"] / base["peak_mb"],
        }
        data["cases"][case] = entry
        lines.append(
            f"| {case} | {base['seconds']:.2f} | {scan['seconds']:.2f} | {entry['time_ratio']:.2f} | "
            f"{base['peak_mb']:.0f} | {scan['peak_mb']:.0f} | {entry['memory_ratio']:.2f} | {full['seconds']:.2f} | "
            f"{entry['time_ratio_with_backward']:.2f} | {entry['memory_ratio_with_backward']:.2f} |"
        )
    markdown = (
        "Scan cost vs one FP32 forward+backward (medians; peak RSS above the warmed-up model, own process per "
        "variant). `scan` = default (forward only, no_grad); `scan+backward` = with loss_fn and loss_scale.\n\n"
        + "\n".join(lines)
    )
    write_result("scan", data, markdown)
    print(markdown)
    return data


if __name__ == "__main__":
    run()
