"""A DeepSpeed training script with no ampsafe in it (the issue's measured case), for 2 gloo ranks on a CPU.

Three plain Linear layers regress a target of 1e6 with AdamW at lr 0.5: the last layer's (``head``) float16
output passes 65504 after a few steps, grown by training (nothing injected). ``MODE`` picks DeepSpeed's
loss-scale implementation: ``zero0`` (FP16_UnfusedOptimizer), ``zero1`` / ``zero2`` (ZeRO's DynamicLossScaler),
``autocast0`` / ``autocast2`` (``torch_autocast`` float16 with torch's GradScaler, ZeRO-0 / ZeRO-2).

    torchrun --nproc_per_node 2 ds_train.py MODE[,MODE...] OUT [--steps N[,N...]] [--save-at K] [--island PATHS]

One process runs the modes one after another (a fresh engine each); ``MODE/island`` applies ampsafe's printed
island line (``--island PATHS``) up front, ``MODE/wrap`` calls ``ampsafe.deepspeed.wrap(engine)`` (the explicit
API), ``MODE/raise`` the same with ``on_floor="raise"``. Each rank writes ``OUT/MODE/rank<r>.json`` (``OUT/MODE-island/...``):
per step the loss scale, whether the step was skipped and the head's max |output|, the error that ended the run,
a checksum of its parameters, the islanded modules. ``--save-at K``: ``save_checkpoint`` K steps before the end,
one more step, then ``load_checkpoint`` rolls it back and training goes on. ``--island``: ampsafe's printed
island line applied up front. The CPU setup (float16 gate, no shm build) is :mod:`ds_cpu`, the tests' part.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import ds_cpu
import torch
from torch import nn

WIDTH = 64  # in float32 the head's max |output| passes 65504 at step 7 (7.5e4; 4.8e4 at step 6)
SCALE_POWER = 4  # DeepSpeed's initial_scale_power: 16 at the start, the floor (1) after 4 backoffs

FP16 = {
    "enabled": True,
    "initial_scale_power": SCALE_POWER,
    "loss_scale_window": 1000,
    "hysteresis": 1,
    "min_loss_scale": 1,
}
AUTOCAST = {"enabled": True, "dtype": "float16"}
CONFIGS = {
    "zero0": {"fp16": FP16, "zero_optimization": {"stage": 0}},
    "zero1": {"fp16": FP16, "zero_optimization": {"stage": 1}},
    "zero2": {"fp16": FP16, "zero_optimization": {"stage": 2}},
    "zero3": {"fp16": FP16, "zero_optimization": {"stage": 3}},
    "autocast0": {"torch_autocast": AUTOCAST, "zero_optimization": {"stage": 0}},
    "autocast2": {"torch_autocast": AUTOCAST, "zero_optimization": {"stage": 2}},
    "autocast3": {"torch_autocast": AUTOCAST, "zero_optimization": {"stage": 3}},
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        return self.head(torch.relu(self.mid(torch.relu(self.inp(x)))))


def config(mode: str) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        **CONFIGS[mode],
    }


def build(mode: str, island: list):
    """The engine of ``mode`` (``base/variant``): ``/island`` applies ampsafe's printed line (the paths
    ``island``) right after ``deepspeed.initialize``, ``/wrap`` calls ``ampsafe.deepspeed.wrap`` there."""
    import deepspeed

    base, _, variant = mode.partition("/")
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config(base))
    if variant == "island":
        import ampsafe

        ampsafe.patch(engine.module, policy="island", paths=island)
    elif variant in ("wrap", "raise"):
        import ampsafe

        ampsafe.deepspeed.wrap(engine, min_scale=1.0, on_floor="heal" if variant == "wrap" else "raise")
    return engine


def scale_of(engine) -> float:
    scaler = getattr(engine, "torch_autocast_z0_gradscaler", None) or getattr(
        engine.optimizer, "torch_autocast_gradscaler", None
    )
    return float(scaler.get_scale()) if scaler is not None else float(engine.optimizer.loss_scale)


def train(engine, steps: range, rank: int, half: bool, log: list) -> None:
    skips = [engine.skipped_steps]
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.rand(8, 8, generator=g)
        out = engine(x.half() if half else x)
        loss = ((out.float() / 1e6 - 1.0) ** 2).mean()
        scale = scale_of(engine)
        engine.backward(loss)
        engine.step()
        skipped = engine.skipped_steps > skips[0] or scale_of(engine) < scale  # torch's scaler skips unseen
        skips[0] = engine.skipped_steps
        log.append({"step": step, "scale": scale, "skipped": bool(skipped), "amax": float(out.detach().abs().max())})


def drain(engine) -> None:
    """Waits out the collectives the engine left in flight. A ZeRO-3 all-gather still held by gloo's worker thread
    when the interpreter finalizes is freed there; freeing its tensors needs the GIL, so the thread exits inside
    C++ and the process aborts ("terminate called without an active exception": rank 1 in 5 of 57 launches on
    two loaded cores; the core dump's backtrace is ``~AsyncAllgatherWork`` in ``ProcessGroupGloo::runLoop``
    during ``Py_FinalizeEx``). Gloo's barrier completes after every earlier work of its group: the world's
    (ZeRO-3's parameters) and the engine's data-parallel clone of it (the optimizer's partitions)."""
    groups = (None, engine.data_parallel_group, getattr(engine.optimizer, "dp_process_group", None))
    for group in {id(g): g for g in groups}.values():
        torch.distributed.barrier(group=group)


def run_mode(mode: str, island: list, steps: int, save_at: int | None, out: Path, rank: int) -> None:
    """One engine of ``mode`` trained for ``steps``; ``save_at``: ``save_checkpoint`` after that step, then the
    engine rolled back with ``load_checkpoint`` and trained on."""
    half = "fp16" in CONFIGS[mode.partition("/")[0]]
    result = {"rank": rank, "steps": [], "error": None}
    engine = None
    try:
        engine = build(mode, island)
        first = range(steps if save_at is None else save_at + 1)
        train(engine, first, rank, half, result["steps"])
        if save_at is not None:
            ckpt = out / "ckpt"
            engine.save_checkpoint(str(ckpt), tag="t")
            result["saved_scale"] = scale_of(engine)
            train(engine, range(save_at + 1, save_at + 2), rank, half, [])  # moves on, then rolls back
            engine.load_checkpoint(str(ckpt), tag="t")
            result["resumed_scale"] = scale_of(engine)
            train(engine, range(save_at + 1, steps), rank, half, result["steps"])
    except Exception as exc:  # the run's end, quoted in the json
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    if engine is not None:
        drain(engine)
    params = [p.detach().float() for p in engine.module.parameters()] if engine is not None else []
    result["checksum"] = [float(p.double().sum()) for p in params]
    result["finite"] = all(bool(torch.isfinite(p).all()) for p in params)
    modules = engine.module.named_modules() if engine is not None else ()
    result["islands"] = sorted(n for n, m in modules if getattr(m, "_ampsafe_protection", None) == "island")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "modes", help="comma-separated: " + ", ".join(CONFIGS) + ", each /island, /wrap or /raise (fp16 first)"
    )
    parser.add_argument("out")
    parser.add_argument("--steps", default="16", help="one number, or one per mode (comma-separated)")
    parser.add_argument("--save-at", type=int, default=None, help="steps before the end to save and resume at")
    parser.add_argument("--island", default="", help="JSON list of paths of engine.module to island up front")
    args = parser.parse_args()
    modes = args.modes.split(",")
    steps = [int(n) for n in args.steps.split(",")] * (len(modes) if "," not in args.steps else 1)
    ds_cpu.open_cpu_float16()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    island = json.loads(args.island) if args.island else []
    for mode, n in zip(modes, steps):
        save_at = None if args.save_at is None else n - args.save_at
        run_mode(mode, island, n, save_at, Path(args.out) / mode.replace("/", "-"), rank)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
