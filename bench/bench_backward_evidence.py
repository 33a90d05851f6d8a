"""The backward's evidence costs a healthy step nothing: ampsafe's healing scaler against torch's own.

Whole training steps (forward under CPU float16 autocast, backward, ``step``, ``update``) of a 12-layer MLP
with 4 heads of width 256 (batch 64), interleaved step by step so that a shared machine's load hits every
candidate alike:

* ``torch``: ``torch.amp.GradScaler``;
* ``ampsafe``: ``ampsafe.torch.GradScaler(on_floor="heal")``, healthy steps (the backward trace unarmed: no hook);
* ``ampsafe armed``: the same scaler with its backward trace armed, which happens only on the steps after an
  overflowing one (a hook on every module's inputs and outputs, one finiteness check per gradient).

The ratios against ``torch`` are the result; the seconds are this machine's.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_result  # noqa: E402

STEPS = 60
LAYERS = 12
WIDTH = 256


def _model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 4))


def _stepper(scaler):
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64, WIDTH)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def run() -> dict:
    import torch

    import ampsafe

    torch.set_num_threads(1)
    healthy = ampsafe.torch.GradScaler("cpu", init_scale=1024.0, on_floor="heal")
    armed = ampsafe.torch.GradScaler("cpu", init_scale=1024.0, on_floor="heal")
    candidates = {
        "torch": _stepper(torch.amp.GradScaler("cpu", init_scale=1024.0)),
        "ampsafe": _stepper(healthy),
        "ampsafe armed": _stepper(armed),
    }
    for step in candidates.values():  # warm-up; resolves each scaler's model at its first step
        for _ in range(5):
            step()
    times = {name: [] for name in candidates}
    names = list(candidates)
    for i in range(STEPS):
        for name in names if i % 2 == 0 else names[::-1]:
            if name == "ampsafe armed":
                armed._trace.arm()  # as after an overflowing step (its clean update disarms it again)
            t0 = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - t0)
    assert healthy.stats.overflow_steps == 0 and not healthy._trace.armed
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "steps": STEPS,
        "model": f"{LAYERS}x Linear({WIDTH}, {WIDTH}) + GELU, batch 64, 1 torch thread",
        "median_s": median,
        "ratio_vs_torch": {name: median[name] / median["torch"] for name in median},
    }


def main() -> None:
    data = run()
    rows = [
        f"| {name} | {data['median_s'][name] * 1e3:.2f} | {data['ratio_vs_torch'][name]:.3f} |"
        for name in data["median_s"]
    ]
    markdown = "\n".join(
        [
            "# The backward's evidence: its cost",
            "",
            f"{data['model']}; {data['steps']} interleaved whole training steps per candidate (median).",
            "",
            "| scaler | ms per step | ratio to torch's scaler |",
            "|---|---|---|",
            *rows,
            "",
            "`ampsafe` is the healing scaler on healthy steps (its backward trace unarmed, as on every step that "
            "follows a clean one); `ampsafe armed` is a step after an overflowing one, with the trace's hooks.",
        ]
    )
    write_result("backward_evidence", data, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
