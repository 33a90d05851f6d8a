"""Overhead of ampsafe's float16 *emulation* for Paddle on a CPU: step time with / without emulate_fp16.

An emulation reproduces float16 overflow and rounding in float32 arithmetic plus casts; it is never a speed
measurement of float16 training. Measured: a small conv net and, when the workload exists, the dbnet training
step (forward + DBLoss + backward, 128x128, batch 8), at O1 and O2.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_time, write_result  # noqa: E402


def _small_convnet():
    import paddle
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2D(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2D(16, 16, 3, stride=2, padding=1)
            self.head = nn.Sequential(nn.Conv2D(32, 16, 3, padding=1, bias_attr=False), nn.BatchNorm2D(16), nn.ReLU())
            self.out = nn.Conv2D(16, 1, 1)

        def forward(self, x):
            c1 = nn.functional.relu(self.conv1(x))
            c2 = nn.functional.relu(self.conv2(c1))
            a = c1 + nn.functional.upsample(c2, scale_factor=2, mode="nearest")
            return self.out(self.head(paddle.concat([a, c1], axis=1)))

    paddle.seed(0)
    model = Net()
    x = paddle.randn([8, 3, 64, 64])
    return model, lambda: model(x).mean()


def _dbnet():
    from ampsafe_lab.workloads import build

    work = build("dbnet", seed=0, image_size=128, batch_size=8)
    batch = work.batch(0)
    return work.model, lambda: work.loss(batch)


def _measure(model, loss_fn, repeats: int) -> dict:
    from ampsafe.paddle import emulate_fp16

    def plain():
        model.clear_gradients()
        loss_fn().backward()

    def emulated(level):
        def step():
            model.clear_gradients()
            with emulate_fp16(model, level=level):
                loss_fn().backward()

        return step

    base, _ = median_time(plain, repeats=repeats)
    row = {"fp32_step_s": base}
    for level in ("O1", "O2"):
        t, _ = median_time(emulated(level), repeats=repeats)
        row[f"{level}_emulated_step_s"] = t
        row[f"{level}_overhead_ratio"] = t / base
    return row


def run(suite: str = "quick") -> dict:
    repeats = 3 if suite == "quick" else 7
    cases = {"small_convnet_8x3x64x64": _small_convnet}
    try:
        import ampsafe_lab.workloads.dbnet  # noqa: F401

        cases["dbnet_step_128px_batch8"] = _dbnet
    except ImportError:
        pass
    data = {"suite": suite, "repeats": repeats, "note": "float16 emulation overhead on CPU, not a speed", "cases": {}}
    lines = [
        "Overhead of `ampsafe.paddle.emulate_fp16` (an emulation of float16 AMP in float32 on a CPU, not a speed):",
        "median step time (forward + loss + backward) with and without it, ratios from the same run.",
        "",
        "| case | fp32 step (s) | O1 emulated (s) | O1 ratio | O2 emulated (s) | O2 ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, make in cases.items():
        try:
            model, loss_fn = make()
        except Exception as exc:  # a workload still being built by its owner: say so, measure the rest
            data["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            lines.append(f"| {name} | not measured: {type(exc).__name__} | | | | |")
            continue
        row = _measure(model, loss_fn, repeats)
        data["cases"][name] = row
        lines.append(
            f"| {name} | {row['fp32_step_s']:.3f} | {row['O1_emulated_step_s']:.3f} | {row['O1_overhead_ratio']:.2f}x"
            f" | {row['O2_emulated_step_s']:.3f} | {row['O2_overhead_ratio']:.2f}x |"
        )
    write_result("emulator", data, "\n".join(lines))
    return data


if __name__ == "__main__":
    run()
