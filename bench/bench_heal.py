"""Self-healing: throughput after ``ampsafe.heal`` islanded the overflowing paths vs the same paths islanded up front.

(a) unpatched with ``GradScaler(on_floor="heal")`` + ``ampsafe.heal(patience=2)`` trained until it has healed;
(b) a fresh model with (a)'s weights, patched with ``policy="island"`` for exactly the modules (a) islanded.
Then train steps of both on one batch are timed, alternated so both see the same load on the shared CPU.
A heal is a class swap like ``patch``, so (a) should be as fast as (b). Models: ``dbnet`` under
``ampsafe.paddle.emulate_fp16`` (EMULATED float16: every op runs in float32 on the CPU, so the absolute speed
says nothing about a GPU), the ``frcnn`` brink and ``GrowNet`` (below) under real CPU float16 autocast.

``GrowNet`` is the torch analogue of DBNet's failure (an unnormalized conv chain whose output grows past 65504
under Adam at a high learning rate); it, its training run and the frcnn heal run live in
:mod:`ampsafe_lab.workloads.heal_runs`, shared with the heal tests.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ampsafe_lab.workloads.heal_runs import GROW_RECIPE as TORCH_RECIPE  # noqa: E402
from ampsafe_lab.workloads.heal_runs import (  # noqa: E402
    fp16_step,
    grow_batch,
    grow_loss,
    grow_net,
    train_frcnn_heal,
    train_grow,
)
from bench.common import track, write_result  # noqa: E402


def _interleaved(step_a, step_b, repeats: int) -> dict:
    """Time two step functions alternated (a, b, a) so both see the same load on the shared CPU.

    ``ratio``: median over rounds of (b seconds / a seconds), i.e. a's speed over b's; ``control``: the same for
    a's two runs within a round, the noise floor of the ratio on this machine (1.0 on a quiet one).
    """
    step_a(), step_b()  # warm-up
    ta, tb, ta2 = [], [], []
    for _ in track(range(repeats), "healed vs island"):
        for fn, out in ((step_a, ta), (step_b, tb), (step_a, ta2)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    ratios = sorted(b / a for a, b in zip(ta, tb))
    controls = sorted(a2 / a for a, a2 in zip(ta, ta2))
    return {
        "a_steps_per_s": 1.0 / statistics.median(ta),
        "b_steps_per_s": 1.0 / statistics.median(tb),
        "ratio": statistics.median(ratios),
        "ratio_iqr": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
        "control": statistics.median(controls),
        "control_iqr": [controls[len(controls) // 4], controls[(3 * len(controls)) // 4]],
    }


def _timing(timed: dict) -> dict:
    """The healed (a) vs island (b) fields of a bench row."""
    return {
        "healed_steps_per_s": timed["a_steps_per_s"],
        "island_steps_per_s": timed["b_steps_per_s"],
        "ratio": timed["ratio"],
        "ratio_iqr": timed["ratio_iqr"],
        "control": timed["control"],
        "control_iqr": timed["control_iqr"],
    }


def _torch_stepper(model, batch, lr: float):
    import torch

    from ampsafe.torch import GradScaler

    opt = torch.optim.Adam(model.parameters(), lr=lr * 1e-3)  # small: timing only, keep values in range
    scaler = GradScaler("cpu", init_scale=1024.0, min_scale=1.0, on_floor="clamp")
    x, y = batch

    def step():
        fp16_step(lambda: grow_loss(model(x), y), scaler, opt)

    return step


def bench_torch(repeats: int) -> dict:
    """GrowNet: heal during training, then time train steps of the healed model vs one islanded up front."""
    import ampsafe

    r = TORCH_RECIPE
    t0 = time.perf_counter()
    healed = train_grow("heal", steps=16, patience=2)
    heal_seconds = time.perf_counter() - t0
    if not healed["scaler"].stats.heals:
        raise RuntimeError("GrowNet did not overflow: no heal to measure")
    record = healed["scaler"].stats.heals[0]
    paths = list(healed["healer"].heals[0].found)
    fresh = grow_net(0, r["channels"], r["neck_convs"])
    fresh.load_state_dict(healed["model"].state_dict())  # same values: only the way the islands came differs
    ampsafe.patch(fresh, policy="island", paths=list(healed["healer"].heals[0].paths))
    assert ampsafe.patching.patched_modules(fresh) == ampsafe.patching.patched_modules(healed["model"])
    batch = grow_batch(1000, 0, r["image_size"], r["batch_size"])
    timed = _interleaved(
        _torch_stepper(healed["model"], batch, r["lr"]), _torch_stepper(fresh, batch, r["lr"]), repeats
    )
    return {
        "model": f"GrowNet (torch, real CPU float16 autocast), {r['image_size']}x{r['image_size']}, batch {r['batch_size']}",
        "first_overflow": healed["overflowed"].index(True),
        "heal_step": record.step,
        "paths": paths,
        "patched": list(healed["healer"].heals[0].paths),
        "scale_before": record.scale_before,
        "scale_after": record.scale_after,
        "overflowing_steps": sum(healed["overflowed"]),
        "train_seconds_16_steps": round(heal_seconds, 2),
        **_timing(timed),
    }


def _frcnn_stepper(model, batch, lr: float):
    import torch

    from ampsafe.torch import GradScaler
    from ampsafe_lab.workloads import frcnn_brink

    opt, _ = frcnn_brink.recipe_optimizer(model, lr=lr, warmup_steps=0)
    scaler = GradScaler("cpu", init_scale=4.0, min_scale=1.0, on_floor="clamp")

    def step():
        torch.manual_seed(0)  # the same RoI sampling every time
        fp16_step(lambda: sum(model(*batch).values()), scaler, opt)

    return step


def bench_frcnn(repeats: int, steps: int = 4, lr: float = 1e-4) -> dict:
    """frcnn brink (real CPU float16 autocast): heal during training (:func:`train_frcnn_heal`, with Adam at lr
    1e-4 so the timed steps stay in range), then time healed vs islanded up front."""
    import ampsafe
    from ampsafe_lab.workloads import frcnn_brink

    run = train_frcnn_heal(steps, lr)
    w, scaler, healer, overflowed = run["workload"], run["scaler"], run["healer"], run["skipped"]
    train_seconds = run["seconds"]
    if not scaler.stats.heals:
        raise RuntimeError("frcnn did not heal within the steps: nothing to measure")
    record = scaler.stats.heals[0]
    patched = ampsafe.patching.patched_modules(w.model)
    fresh = frcnn_brink.brink_workload(0)
    fresh.model.load_state_dict(w.model.state_dict())  # same values: only the way the islands came differs
    ampsafe.patch(fresh.model, policy="island", paths=sorted(patched))
    assert ampsafe.patching.patched_modules(fresh.model) == patched
    batch = w.batch(1000)
    timed = _interleaved(_frcnn_stepper(w.model, batch, lr), _frcnn_stepper(fresh.model, batch, lr), repeats)
    return {
        "model": "frcnn brink (torchvision fasterrcnn_mobilenet_v3_large_320_fpn), 160x160, batch 2, real CPU "
        "float16 autocast",
        "first_overflow": overflowed.index(True),
        "heal_step": record.step,
        "paths": list(healer.heals[0].found),
        "patched": sorted(patched),
        "scale_before": record.scale_before,
        "scale_after": record.scale_after,
        "overflowing_steps": sum(overflowed),
        "train_seconds": round(train_seconds, 1),
        **_timing(timed),
    }


def _paddle_stepper(w, model_batch, lr: float):
    from ampsafe.paddle import GradScaler

    opt = w.make_optimizer(lr * 1e-3)
    scaler = GradScaler(init_loss_scaling=1024.0, min_loss_scaling=1.0, on_floor="clamp")

    def step():
        loss = w.loss(model_batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()

    return step


def bench_paddle(repeats: int, steps: int = 12) -> dict:
    """dbnet (demo recipe, EMULATED float16): heal during training, then time healed vs islanded up front."""
    import logging

    import ampsafe
    import ampsafe_lab.workloads
    from ampsafe.paddle import emulate_fp16
    from ampsafe_lab.demo import run_paddle

    logged: list = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = logged.append
    logger = logging.getLogger("ampsafe.heal")
    logger.addHandler(handler)
    built: list = []
    try:
        trace = run_paddle(
            "heal",
            steps=steps,
            lr=1e-2,
            level="O1",
            seed=0,
            image_size=128,
            batch_size=8,
            heal_options={"patience": 2},
            workload_out=built,
        )
    finally:
        logger.removeHandler(handler)
    if not logged:
        raise RuntimeError("dbnet did not overflow within the steps: no heal to measure")
    healed = built[0]
    patched = ampsafe.patching.patched_modules(healed.model)
    fresh = ampsafe_lab.workloads.build("dbnet", seed=0, image_size=128, batch_size=8)
    fresh.model.set_state_dict(healed.model.state_dict())  # same values: only the way the islands came differs
    ampsafe.patch(fresh.model, policy="island", paths=sorted(patched))
    assert ampsafe.patching.patched_modules(fresh.model) == patched
    batch = healed.batch(1000)
    with emulate_fp16(healed.model), emulate_fp16(fresh.model):
        timed = _interleaved(_paddle_stepper(healed, batch, 1e-2), _paddle_stepper(fresh, batch, 1e-2), repeats)
    first = trace.overflowed.index(True)
    return {
        "model": "dbnet (det_mv3_db), 128x128, batch 8, Paddle O1 EMULATED float16 on CPU (ampsafe.paddle.emulate_fp16)",
        "first_overflow": first,
        "heal_step": logged[0].args[0],
        "paths": logged[0].args[2].split(", "),
        "patched": sorted(patched),
        "scale_restored": logged[0].args[4],
        "scales": trace.scales,
        "overflowing_steps": sum(trace.overflowed),
        "train_seconds": round(trace.seconds, 1),
        **_timing(timed),
    }


ROWS = (("paddle", "dbnet"), ("frcnn", "frcnn"), ("torch", "GrowNet"))


def run(suite: str = "quick") -> dict:
    repeats = 7 if suite == "quick" else 15
    data = {
        "suite": suite,
        "torch": bench_torch(repeats * 15),
        "frcnn": bench_frcnn(repeats),
        "paddle": bench_paddle(repeats),
    }
    lines = [
        "## Self-healing: throughput after the heal vs the same paths islanded before training",
        "",
        "Train steps (forward + backward + scaler + Adam) on the same batch, in rounds of healed, island, healed "
        f"again; {repeats} rounds (GrowNet: 15x that). ratio = median over rounds of healed steps/s over island "
        "steps/s (target >= 1); control = the same for the healed model against itself, i.e. the noise of a ratio "
        "on these 2 shared CPU cores. The healed and the island model have the same patched modules (asserted), "
        "so they run the same computation.",
        "",
        "| model | first overflow | healed at step | scale restored | healed steps/s | island steps/s | ratio (IQR) "
        "| control (IQR) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, _ in ROWS:
        d = data[key]
        restored = d.get("scale_restored", d.get("scale_after"))
        lines.append(
            f"| {d['model']} | {d['first_overflow']} | {d['heal_step']} | {restored} | "
            f"{d['healed_steps_per_s']:.3f} | {d['island_steps_per_s']:.3f} | {d['ratio']:.3f} "
            f"({d['ratio_iqr'][0]:.3f}-{d['ratio_iqr'][1]:.3f}) | {d['control']:.3f} "
            f"({d['control_iqr'][0]:.3f}-{d['control_iqr'][1]:.3f}) |"
        )
    lines.append("")
    lines += [f"Healed paths ({label}): {', '.join(data[key]['paths'])}." for key, label in ROWS]
    write_result("heal", data, "\n".join(lines))
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    run()
