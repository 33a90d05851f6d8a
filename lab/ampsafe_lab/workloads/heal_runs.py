"""Self-healing training runs shared by the heal tests and the heal bench (``bench/bench_heal.py``).

``GrowNet`` is the torch analogue of DBNet's failure: a BatchNorm backbone, an unnormalized residual chain of
3x3 convs (the "neck") and a head whose first conv is followed by BatchNorm, so nothing bounds its output.
Under Adam at a high learning rate the chain's weights grow together and ``head.conv1`` leaves float16's range
after a few steps while float32 training is healthy (:func:`train_grow`). :func:`train_frcnn_heal` trains the
frcnn brink (:mod:`ampsafe_lab.workloads.frcnn_brink`) on under real CPU float16 autocast until it heals.
:func:`fp16_step` is the one float16 autocast training step both use. Torch is imported when they run.
"""

from __future__ import annotations

import time

__all__ = ["GROW_RECIPE", "grow_net", "grow_batch", "grow_loss", "fp16_step", "train_grow", "train_frcnn_heal"]

GROW_RECIPE = {"channels": 16, "neck_convs": 4, "image_size": 16, "batch_size": 8, "lr": 1e-1, "init_scale": 1024.0}


def grow_net(seed: int = 0, channels: int = 16, neck_convs: int = 4):
    """The GrowNet module (see the module docstring), deterministic for ``seed``."""
    import torch
    from torch import nn

    class GrowNet(nn.Module):
        def __init__(self):
            super().__init__()
            c = channels
            self.backbone = nn.Sequential(
                nn.Conv2d(3, c, 3, 2, 1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1, bias=False),
                nn.BatchNorm2d(c),
                nn.ReLU(),
            )
            self.neck = nn.ModuleDict({f"conv{i}": nn.Conv2d(c, c, 3, 1, 1, bias=False) for i in range(neck_convs)})
            self.head = nn.ModuleDict(
                {"conv1": nn.Conv2d(c, c, 3, 1, 1, bias=False), "bn": nn.BatchNorm2d(c), "conv2": nn.Conv2d(c, 1, 1)}
            )

        def forward(self, x):
            f = self.backbone(x)
            for conv in self.neck.values():
                f = conv(f) + f
            return self.head["conv2"](torch.relu(self.head["bn"](self.head["conv1"](f))))

    torch.manual_seed(seed)
    return GrowNet()


def grow_batch(step: int, seed: int = 0, image_size: int = 32, batch_size: int = 8):
    """(images, target map) for ``step``: the target is where the image is brighter than average."""
    import torch

    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    y = (x.mean(1, keepdim=True)[:, :, ::2, ::2] > 0).float()
    return x, y


def grow_loss(out, y):
    import torch

    return torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y)


def fp16_step(loss_fn, scaler, opt, enabled: bool = True):
    """One training step under CPU float16 autocast with a GradScaler; returns the loss (``loss_fn()``)."""
    import torch

    with torch.autocast("cpu", dtype=torch.float16, enabled=enabled):
        loss = loss_fn()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss


def train_grow(
    mode: str,
    *,
    steps: int,
    seed: int = 0,
    paths=None,
    max_heals: int = 3,
    patience: int | None = None,
    recipe: dict | None = None,
    batch_hook=None,
):
    """Train GrowNet under CPU float16 autocast; returns a dict (losses, scales, overflowed, model, scaler, ...).

    ``mode``: "heal" (unpatched, ``on_floor="heal"`` + ``ampsafe.heal``), "island" (``patch(policy="island")`` on
    ``paths`` or, without, on what scan finds), "fp32" (no autocast). ``batch_hook(step, x, model) -> x`` alters a batch (or the model).
    """
    import torch

    import ampsafe
    from ampsafe.torch import GradScaler

    r = {**GROW_RECIPE, **(recipe or {})}
    model = grow_net(seed, r["channels"], r["neck_convs"])
    example = (grow_batch(0, seed, r["image_size"], r["batch_size"])[0],)
    healer = None
    if mode == "island":
        if paths is None:
            report = ampsafe.scan(model, example, target="cpu")
            ampsafe.patch(model, policy="island", report=report)
        else:
            ampsafe.patch(model, policy="island", paths=list(paths))
    opt = torch.optim.Adam(model.parameters(), lr=r["lr"])
    scaler = GradScaler("cpu", init_scale=r["init_scale"], min_scale=1.0, on_floor="heal", enabled=mode != "fp32")
    if mode == "heal":
        healer = ampsafe.heal(model, scaler=scaler, target="cpu", max_heals=max_heals, patience=patience)
    out = {"losses": [], "scales": [], "overflowed": [], "model": model, "scaler": scaler, "healer": healer}
    for step in range(steps):
        x, y = grow_batch(step, seed, r["image_size"], r["batch_size"])
        if batch_hook is not None:
            x = batch_hook(step, x, model)
        scale = scaler.get_scale()
        skipped = scaler.stats.skipped_steps
        loss = fp16_step(lambda: grow_loss(model(x), y), scaler, opt, enabled=mode != "fp32")  # noqa: B023
        out["losses"].append(float(loss.detach()))
        out["scales"].append(float(scale))
        out["overflowed"].append(scaler.stats.skipped_steps > skipped)
    return out


def train_frcnn_heal(steps: int, lr: float | None = None, init_scale: float = 4.0, seed: int = 0) -> dict:
    """The frcnn brink of ``seed`` trained on under real CPU float16 autocast with ``GradScaler(on_floor="heal")``
    + ``ampsafe.heal``: loss scale from ``init_scale`` with a floor of 1, so the third overflowing step (from 4) is
    the floor hit that heals; ``lr=None``: the brink recipe's Adam lr (1e-2).

    Besides losses and skipped steps, ``forward_nonfinite[step]`` lists the leaf modules whose output was
    non-finite in that step's own forward (heal replays not counted): a skipped step with none was a
    backward-only overflow, which the scaler handles by backing off, not a forward one that heal must fix."""
    import torch

    import ampsafe
    from ampsafe.torch import GradScaler
    from ampsafe_lab.workloads import frcnn_brink

    w = frcnn_brink.brink_workload(seed)
    scaler = GradScaler("cpu", init_scale=init_scale, min_scale=1.0, on_floor="heal", model=w.model)
    healer = ampsafe.heal(w.model, scaler=scaler, level="O1", target="cpu")
    opt, _ = frcnn_brink.recipe_optimizer(w.model, lr=lr, warmup_steps=0)
    out = {"workload": w, "scaler": scaler, "healer": healer, "losses": [], "skipped": [], "forward_nonfinite": []}
    out["params_before"] = [id(p) for p in w.model.parameters()]
    in_forward, bad = [False], []

    def record_nonfinite(name):
        def hook(module, inputs, output):
            if in_forward[0] and torch.is_tensor(output) and output.is_floating_point():
                if not bool(torch.isfinite(output).all()):
                    bad.append(name)

        return hook

    leaves = [(n, m) for n, m in w.model.named_modules() if n and next(m.children(), None) is None]
    handles = [m.register_forward_hook(record_nonfinite(n)) for n, m in leaves]

    def step_loss(step):
        in_forward[0] = True
        try:
            return w.loss(w.batch(step))
        finally:
            in_forward[0] = False

    t0 = time.perf_counter()
    torch.manual_seed(seed)  # RoI sampling
    try:
        for step in range(steps):
            before = scaler.stats.skipped_steps
            bad.clear()
            loss = fp16_step(lambda: step_loss(step), scaler, opt)  # noqa: B023 - called at once
            out["losses"].append(loss.item())
            out["skipped"].append(scaler.stats.skipped_steps > before)
            out["forward_nonfinite"].append(list(dict.fromkeys(bad)))
    finally:
        for handle in handles:
            handle.remove()
    out["seconds"] = time.perf_counter() - t0
    return out
