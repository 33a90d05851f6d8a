"""Fine-tuning the shipped PP-OCRv4 detector under Paddle AMP, as a PaddleOCR user runs it, in six ways.

    recipe = FineTuneRecipe.documented()                 # ch_PP-OCRv4_det_student.yml's optimizer, CPU-sized
    run = finetune("native", recipe, seed=0)             # per step: .losses .scales .overflowed .head_amax
    dark = FineTuneRecipe.documented(pages="screens", freeze_bn=True, train_pages=16, epochs=12)

The student config trains with Adam (0.9 / 0.999), L2 5e-5, and a cosine lr of 0.001 after a linear warmup
of 2 epochs, on 640 px crops, 8 images per card on 8 cards. A 2-core CPU affords neither: the recipe keeps
the optimizer, the schedule's shape (warmup epochs, then cosine to 0 over the run's epochs, as PaddleOCR's
``Cosine`` builds it) and the loss, on ``batch_size`` rendered pages of ``image_size`` px, an epoch being
``train_pages`` pages. float16 is ``ampsafe.paddle.emulate_fp16`` at ``level``; the loss scale starts at
1024, dynamic, as PaddleOCR's AMP docs set ``Global.scale_loss`` / ``use_dynamic_loss_scaling``.

Modes (:data:`MODES`): ``fp32``; ``native`` (Paddle's scaler: no floor); ``fix_nan`` (native, with NaN set to
0 after the head's ``conv_bn1`` and ``conv_bn2``, the guard PaddleOCR's later det heads carry); ``heal``
(ampsafe's scaler as ``ampsafe run`` installs it with zero edits: floor 1, heal at the floor); ``island``
(the paths ``ampsafe.scan`` finds risky on the first batch, in float32) and ``convbn`` (a fresh BatchNorm after
each unnormalized conv), both ``ampsafe.patch`` up front with ampsafe's floored scaler.

The documented recipe needs no push to overflow (measured, seed 0, FP32): ``head.binarize.conv1``'s output
reaches 2.7e5 at step 2, after one update at lr 1.25e-4 in the warmup: that batch's two pages with BatchNorm in
train mode (on the batch's statistics; the train-mode BN after it makes the conv's scale free to grow); again
7.2e5 at step 6 and 1.4e5-3.6e5 from step 15 on, while the FP32 loss falls from 5.5 to 2.0. Those spikes also
reach the BatchNorms' running statistics, in FP32 too: FP32's own held-out hmean after 20 steps is 0.906 / 0.000
on seeds 0 / 1, and 1.000 / 0.940 once the shipped statistics are put back. With every BatchNorm frozen
(``freeze_bn``) on paper pages nothing passes 65504 in 20 steps (FP32 max 2.0e4 / 5.9e4 / 2.4e4 on seeds 0-2);
on ``pages="screens"`` (light text on near-black) the shipped weights already pass it on some pages in
inference (1.9e5 on seed 0's first), so the frozen fine-tune overflows from step 0 in float16.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace

from ..paddle_amp import amp_step

__all__ = [
    "FineTuneRecipe",
    "MODES",
    "TORCH_MODES",
    "finetune_torch",
    "FineTuneRun",
    "finetune",
    "fix_nan",
    "freeze_batch_norms",
]

MODES = ("fp32", "native", "fix_nan", "heal", "island", "convbn")
TORCH_MODES = ("fp32", "native")  # torch's trajectory: FP32 against torch's own GradScaler


@dataclass(frozen=True)
class FineTuneRecipe:
    """One fine-tuning run's settings; :meth:`documented` reads the student config's optimizer."""

    lr: float = 1e-3
    warmup_epoch: float = 2.0
    l2: float = 5e-5
    epochs: int = 5
    train_pages: int = 8
    image_size: int = 320
    batch_size: int = 2
    level: str = "O1"
    init_scale: float = 1024.0
    freeze_bn: bool = False
    pages: str = "paper"

    @classmethod
    def documented(cls, **overrides) -> FineTuneRecipe:
        """The config's Adam, cosine lr with warmup and L2 factor; CPU sizes from the defaults above."""
        from . import load_config

        optimizer = load_config()["Optimizer"]
        recipe = cls(
            lr=float(optimizer["lr"]["learning_rate"]),
            warmup_epoch=float(optimizer["lr"].get("warmup_epoch", 0)),
            l2=float(optimizer.get("regularizer", {}).get("factor", 0.0)),
        )
        return replace(recipe, **overrides)

    def workload(self, seed: int = 0, framework: str = "paddle"):
        """The ``ppocrv4_det`` workload this recipe trains: its page size, batch and page style."""
        import ampsafe_lab.workloads

        return ampsafe_lab.workloads.build(
            "ppocrv4_det", seed=seed, framework=framework, image_size=self.image_size, batch_size=self.batch_size,
            pages=self.pages,
        )  # fmt: skip

    @property
    def steps_per_epoch(self) -> int:
        return max(1, self.train_pages // self.batch_size)

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epoch * self.steps_per_epoch)

    def lr_at(self, step: int) -> float:
        """PaddleOCR's ``Cosine`` with ``warmup_epoch``: linear from 0 over the warmup, then cosine from ``lr``
        to 0 over ``epochs`` epochs."""
        if step < self.warmup_steps:
            return self.lr * step / self.warmup_steps
        return 0.5 * self.lr * (1 + math.cos(math.pi * (step - self.warmup_steps) / self.steps))

    def page_step(self, step: int) -> int:
        """The batch index of ``step``: the same ``train_pages`` pages every epoch."""
        return step % self.steps_per_epoch


@dataclass
class FineTuneRun:
    """What :func:`finetune` returns, per step: the float32 loss, the loss scale the step ran with, whether it
    was skipped for non-finite gradients, ``head.binarize.conv1``'s output amax; and the heals, the notes
    (patches, heals), the seconds and the trained workload."""

    mode: str
    losses: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    overflowed: list = field(default_factory=list)
    head_amax: list = field(default_factory=list)
    heals: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    workload: object = None


HEAD_CONV = "head.binarize.conv1"


def fix_nan(model) -> list:
    """Set NaN to 0 after the DB head's ``conv_bn1`` and ``conv_bn2`` (both branches), as PaddleOCR's
    ``fix_nan`` head option does; returns the hook handles."""
    import paddle

    def zero_nan(layer, inputs, output):
        return paddle.where(paddle.isnan(output), paddle.zeros_like(output), output)

    handles = []
    for branch in ("binarize", "thresh"):
        for bn in ("conv_bn1", "conv_bn2"):
            handles.append(getattr(getattr(model.head, branch), bn).register_forward_post_hook(zero_nan))
    return handles


def freeze_batch_norms(model) -> None:
    """Every normalization layer of ``model`` (torch or Paddle) that keeps running statistics in eval mode: they
    are used, never updated, as small-batch fine-tunes run (DBHead's ``paddle.nn.BatchNorm`` included, which is
    no ``BatchNorm2D``); the rest of the model keeps its mode."""
    from ampsafe._framework import backend_of

    for _path, layer, _mean, _variance in backend_of(model).running_stats(model):
        layer.eval()


def _scaler(mode: str, recipe: FineTuneRecipe, model):
    import ampsafe
    from ampsafe.paddle import GradScaler

    if mode == "fp32":
        return GradScaler(enable=False)
    if mode in ("native", "fix_nan"):  # paddle.amp.GradScaler on a GPU: no floor, no cap
        return GradScaler(
            init_loss_scaling=recipe.init_scale, min_loss_scaling=0.0, max_loss_scaling=math.inf,
            on_floor="clamp", emulated=True,
        )  # fmt: skip
    scaler = GradScaler(
        init_loss_scaling=recipe.init_scale, min_loss_scaling=1.0,
        on_floor="heal" if mode == "heal" else "clamp", emulated=True,
    )  # fmt: skip
    if mode == "heal":  # what `ampsafe run` attaches with zero edits: heal at the floor
        ampsafe.heal(model, scaler=scaler, level=recipe.level)
    return scaler


def finetune(
    mode: str, recipe: FineTuneRecipe, *, seed: int = 0, workload=None, steps: int | None = None
) -> FineTuneRun:
    """Fine-tune the shipped detector (Paddle) in ``mode`` (:data:`MODES`) for ``recipe.steps`` steps, or the
    first ``steps`` of them (the schedule stays the recipe's). ``workload``: a ``ppocrv4_det`` Paddle workload
    built with the recipe's sizes (default: built here for ``seed``)."""
    import paddle

    import ampsafe
    from ampsafe.paddle import emulate_fp16

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    w = workload or recipe.workload(seed)
    model = w.model
    run = FineTuneRun(mode, workload=w)
    if recipe.freeze_bn:
        freeze_batch_norms(model)
    if mode == "island":  # the scan's risky paths in float32 (on these weights: head.binarize.conv1 and its feeders)
        scanned = ampsafe.scan(model, w.example_inputs, level=recipe.level)
        report = ampsafe.patch(model, w.example_inputs, policy="island", level=recipe.level, paths=scanned.risky)
        run.notes.append(f"island: {len(report.patched)} modules patched ({', '.join(report.patched)})")
    elif mode == "convbn":
        report = ampsafe.patch(model, w.example_inputs, policy="convbn", level=recipe.level)
        run.notes.append(f"convbn: {len(report.patched)} modules patched")
    if mode == "fix_nan":
        fix_nan(model)
    head = dict(model.named_sublayers())[HEAD_CONV]
    amax: list = []
    hook = head.register_forward_post_hook(
        lambda layer, inputs, out: amax.append(float(out.astype("float32").abs().max()))
    )
    opt = w.make_optimizer(recipe.lr)
    scaler = _scaler(mode, recipe, model)
    forward_only = recipe.level == "O2" and mode != "fp32"  # PaddleOCR's program.py: the loss outside auto_cast
    emulator = None if mode == "fp32" else emulate_fp16(model, level=recipe.level)
    t0 = time.perf_counter()
    with contextlib.nullcontext() if emulator is None or forward_only else emulator:
        for step in range(recipe.steps if steps is None else steps):
            opt.set_lr(recipe.lr_at(step))
            batch = w.batch(recipe.page_step(step))
            scale = scaler.get_loss_scaling()
            skipped_before = scaler.stats.skipped_steps
            amax.clear()
            loss = amp_step(w, batch, scaler, opt, emulator, forward_only)
            run.head_amax.append(max(amax) if amax else float("nan"))
            run.scales.append(float(scale))
            run.losses.append(float(loss))
            run.overflowed.append(scaler.stats.skipped_steps > skipped_before)
    run.seconds = time.perf_counter() - t0
    hook.remove()  # the workload's later evaluations run without it
    for heal in getattr(scaler.stats, "heals", []):
        found = {name: value for name, value in heal.amax.items() if value is not None}
        run.heals.append({"step": heal.step, "paths": list(heal.paths), "amax": found})
        why = ", ".join(f"{name} {value:.3g}" for name, value in sorted(found.items(), key=lambda kv: -kv[1]))
        run.notes.append(
            f"healed at step {heal.step}: {len(heal.paths)} paths ({', '.join(heal.paths)}); the paths found, with "
            f"their float32 max |x| on the replayed batch (a path within 1 bit of 65504 is healed): {why}"
        )
    if not all(bool(paddle.isfinite(p).all()) for p in model.parameters()):
        run.notes.append("parameters non-finite at the end")
    return run


def finetune_torch(mode: str, recipe: FineTuneRecipe, *, seed: int = 0, steps: int | None = None) -> FineTuneRun:
    """The same recipe in torch (:data:`TORCH_MODES`): ``native`` runs the forward and loss under
    ``torch.autocast("cuda", float16)`` with CUDA autocast's op lists on this CPU (what ``ampsafe run
    --emulate-fp16`` gives a CUDA script) and ``torch.amp.GradScaler`` from ``recipe.init_scale``."""
    import torch

    from ampsafe_lab.workloads.t5 import emulated_cuda_amp

    if mode not in TORCH_MODES:
        raise ValueError(f"mode must be one of {', '.join(TORCH_MODES)}, got {mode!r}")
    w = recipe.workload(seed, "torch")
    run, model = FineTuneRun(mode, workload=w), w.model
    if recipe.freeze_bn:
        freeze_batch_norms(model)
    amax: list = []
    hook = model.get_submodule(HEAD_CONV).register_forward_hook(
        lambda module, inputs, out: amax.append(float(out.float().abs().max()))
    )
    opt = w.make_optimizer(recipe.lr)
    t0 = time.perf_counter()
    with emulated_cuda_amp():
        scaler = torch.amp.GradScaler("cuda", init_scale=recipe.init_scale, enabled=mode == "native")
        for step in range(recipe.steps if steps is None else steps):
            for group in opt.param_groups:
                group["lr"] = recipe.lr_at(step)
            amax.clear()
            scale = scaler.get_scale() if mode == "native" else 1.0
            with torch.autocast("cuda", dtype=torch.float16, enabled=mode == "native"):
                loss = w.loss(w.batch(recipe.page_step(step)))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            run.head_amax.append(max(amax))
            run.scales.append(float(scale))
            run.losses.append(loss.item())
            run.overflowed.append(mode == "native" and scaler.get_scale() < scale)
    run.seconds = time.perf_counter() - t0
    hook.remove()
    stats = [t for name, t in model.state_dict().items() if name.endswith(("running_mean", "running_var"))]
    if not all(bool(torch.isfinite(t).all()) for t in stats):
        run.notes.append("BatchNorm running statistics non-finite at the end")
    return run
