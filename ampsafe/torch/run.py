"""What ``ampsafe run``'s child puts in place in torch, right after torch is imported: :func:`install`, called by
``TorchBackend.install_run``.

In this order:

* ``--emulate-fp16``: :mod:`ampsafe.torch.cuda_emulation` (CUDA AMP as CPU float16 AMP). First, because the
  scalers below build their device through its ``map_device``;
* every spelling of torch's GradScaler (``torch.GradScaler``, ``torch.amp[.grad_scaler].GradScaler``, the
  deprecated ``torch.{cuda,cpu}.amp[.grad_scaler].GradScaler``) resolves to :class:`ampsafe.torch.GradScaler`
  with the run's floor, as its ``amp.scaler_args`` spell it for torch;
* the FP32 guard: every ``torch.optim.Optimizer`` subclass's ``step`` is guarded at its first construction, every
  ``Tensor.backward`` notes its loss, and torch's global step pre-hook counts the steps nobody checked;
* once torchvision's detection models are imported, ``GeneralizedRCNN.forward`` checks its training targets.

Every patch goes through the run's ledger (:class:`~ampsafe.core.ledger.AttrPatches`), so
``ampsafe.auto.uninstall()`` undoes all of it. The run's framework-neutral pieces (its scaler class, the step
guard, the target hooks, the banner) come in ``site`` (see ``Backend.install_run``): this package is below
``ampsafe.run`` and never imports it.
"""

from __future__ import annotations

from typing import Any

from .backend import BACKEND

__all__ = ["install"]

TOP_CALLS_STEPS = 8  # optimizer steps (of any optimizer) during which top-level module calls are watched


def install(options, ledger, site) -> None:
    """Put ``ampsafe run``'s torch hooks in place (``options``: a :class:`~ampsafe.run.options.RunOptions`)."""
    map_device = _emulate(options, ledger, site)
    _swap_scalers(options, ledger, site, map_device)
    _guard_optimizers(ledger, site)
    site.when_imported(
        "torchvision.models.detection.generalized_rcnn",
        lambda module: _check_targets(module, options.on_bad_target, ledger, site),
    )
    site.when_imported("deepspeed", lambda module: _wrap_deepspeed(module, options, ledger, site))


def _emulate(options, ledger, site):
    """``--emulate-fp16``: the emulator installed, its lines in the banner; its ``map_device`` (else None)."""
    if not options.emulate_fp16:
        return None
    from . import cuda_emulation

    for line in cuda_emulation.install():
        site.tell(line)
    ledger.on_restore(cuda_emulation.uninstall)
    return cuda_emulation.map_device


def _swap_scalers(options, ledger, site, map_device) -> None:
    import torch
    import torch.amp.grad_scaler

    from .scaler import GradScaler, device_scaler

    floor = options.scaler_text(BACKEND.amp.scaler_args)
    scaler = site.scaler_class(
        GradScaler,
        BACKEND,
        scale=GradScaler.get_scale,
        guards=lambda s: s._guard or s.is_enabled(),  # scaling, or ampsafe's own FP32 guard mode
        steps=("step",),
        map_device=map_device,
        replaces=torch.amp.GradScaler,
    )
    # the deprecated spellings: device fixed, torch's FutureWarning; isinstance still answers for torch's own class
    aliases = {}
    for device in ("cuda", "cpu"):
        amp = getattr(getattr(torch, device, None), "amp", None)
        aliases[device] = site.shim(device_scaler(scaler, device), getattr(amp, "GradScaler", None))

    def swap(owner, attr: str, value, label: str) -> None:
        site.swap(ledger, owner, attr, value, label)

    swap(torch, "GradScaler", scaler, f"torch.GradScaler -> ampsafe.torch.GradScaler ({floor})")
    swap(torch.amp, "GradScaler", scaler, f"torch.amp.GradScaler -> ampsafe.torch.GradScaler ({floor})")
    swap(torch.amp.grad_scaler, "GradScaler", scaler, "torch.amp.grad_scaler.GradScaler -> ampsafe.torch.GradScaler")
    for device, alias in aliases.items():
        amp = getattr(getattr(torch, device, None), "amp", None)
        for module in (amp, getattr(amp, "grad_scaler", None)):
            if module is not None:
                label = f"{module.__name__}.GradScaler -> ampsafe.torch.GradScaler (deprecated alias)"
                swap(module, "GradScaler", alias, label)
    site.say(f"torch / torch.amp / torch.cuda.amp / torch.cpu.amp GradScaler -> ampsafe.torch.GradScaler ({floor})")


def _wrap_deepspeed(deepspeed, options, ledger, site) -> None:
    """``deepspeed.initialize`` (a script's call, HF Trainer's, accelerate's) returns its engine with the run's
    floor in its loss scale (:func:`ampsafe.torch.deepspeed.wrap`); the run tracks what decides the scale."""
    from .deepspeed import DeepSpeedScale, wrap

    floor = options.scaler_kwargs(BACKEND.amp.scaler_args)

    def make(original):
        def initialize(*args, **kwargs):
            with site.through_scaler():  # ZeRO steps its inner optimizer once at build time (its state)
                result = original(*args, **kwargs)
            engine = result[0] if isinstance(result, tuple) else result
            scale = wrap(engine, **floor)
            if isinstance(scale, DeepSpeedScale):  # a torch_autocast scaler is the run's class: tracked when built
                site.track(scale, BACKEND.name)
            if scale is not None:  # DeepSpeed checks the gradients before its inner optimizer steps
                _through_scaler(engine.optimizer, site)
            if scale is not None:
                site.say(f"deepspeed.initialize: {scale.deepspeed_mode.value} decides with the run's floor")
            return result

        return initialize

    ledger.wrap(deepspeed, "initialize", make, mark="__ampsafe_deepspeed__")
    site.tell(f"deepspeed.initialize -> engines whose loss scale has the run's floor ({options.scaler_text()})")


def _through_scaler(optimizer, site) -> None:
    """``optimizer.step`` (a DeepSpeed engine's, on the instance) inside ``site.through_scaler()``."""
    step = optimizer.step

    def guarded_by_the_engine(*args, **kwargs):
        with site.through_scaler():
            return step(*args, **kwargs)

    optimizer.step = guarded_by_the_engine


def _closure_of(args, kwargs):
    """``step(closure)`` / ``step(closure=...)``; ``step(None)`` is a plain step (accelerate's)."""
    closure = args[0] if args else kwargs.get("closure")
    return closure if callable(closure) else None


def _guard_optimizers(ledger, site) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from .callhooks import TOP_CALLS
    from .grads import nonfinite_params

    guard = site.step_guard(BACKEND, nonfinite_params)
    # an optimizer's forward: train mode with autograd on (eval(), no_grad and inference_mode forwards are not)
    guard.training = lambda model: model.training and torch.is_grad_enabled()
    guard.is_loss = lambda value: isinstance(value, torch.Tensor)

    def call_closure(closure):
        with torch.enable_grad():  # as torch's optimizers call it: their step runs under no_grad
            return closure()

    guard.call_closure = call_closure
    guard.low_precision = _float16_autocast
    guard.add_scaler = _add_scaler
    guard.guard_new_optimizers(
        torch.optim.Optimizer,
        lambda cls: guard.wrap_step(cls, "step", loss_of=lambda args, kwargs: None, closure_of=_closure_of),
    )
    # The module each step calls with its batch (TorchBackend.owner_of) is watched over the first steps only, while
    # the models are resolved: global module hooks put every module call on torch's slow path.
    TOP_CALLS.start()
    ledger.on_restore(TOP_CALLS.reset)
    seen = [0]

    def step_pre_hook(_optimizer, _args, _kwargs) -> None:
        # every torch optimizer step passes here: one neither guarded nor a scaler's is counted as unchecked, so
        # a summary never calls a run with unchecked steps guarded
        guard.saw_step()
        seen[0] += 1
        if seen[0] == TOP_CALLS_STEPS:
            TOP_CALLS.stop()

    ledger.on_restore(register_optimizer_step_pre_hook(step_pre_hook).remove)
    guard.note_losses(torch.Tensor)
    site.tell(f"torch.optim.Optimizer steps guarded without a scaler (skip non-finite; max_skips={guard.max_skips})")


def _float16_autocast() -> str | None:
    """Why a forward starting now computes in float16 (CPU or CUDA autocast at float16), or None."""
    import torch

    for _device, enabled, dtype in BACKEND.amp.state():
        if enabled and dtype == torch.float16:
            return "float16 autocast"
    return None


def _add_scaler(optimizer) -> dict:
    """torch's lines that add a GradScaler to a float16 loop without one (an ``AddScaler`` record as a dict), for
    the device its parameters are on. torch's scaler refuses float16 gradients, so float16 parameters need float32
    master weights and autocast first (the note)."""
    import torch

    params = BACKEND.optimizer_params(optimizer)
    device = params[0].device.type if params else "cuda"
    half = any(p.dtype == torch.float16 for p in params)
    note = (
        "torch's GradScaler refuses float16 gradients ('Attempting to unscale FP16 gradients'): keep the parameters "
        f'float32 (no `.half()`) and run the forward under `torch.autocast("{device}", dtype=torch.float16)`'
        if half
        else ""
    )
    return {
        "framework": "torch",
        "create": f'scaler = torch.amp.GradScaler("{device}")',
        "backward": "scaler.scale(loss).backward()",
        "step": "scaler.step(optimizer)",
        "update": "scaler.update()",
        "replaces_backward": "loss.backward()",
        "replaces_step": "optimizer.step()",
        "note": note,
    }


def _check_targets(generalized_rcnn, policy: str, ledger, site) -> None:
    """torchvision's ``GeneralizedRCNN.forward`` (Faster / Mask / Keypoint R-CNN) checks ``targets`` at every
    training call, image sizes read from ``images``: torchvision's own check is an assert after the transform that
    names no sample, and a NaN box passes it to end as ``loss_box_reg = nan``."""
    hook = site.target_hook("torchvision GeneralizedRCNN targets", policy)

    def make(original):
        def forward(self, images, targets=None, *args: Any, **kwargs: Any):
            if targets is not None and self.training:
                sizes = [tuple(img.shape[-2:]) for img in images] if isinstance(images, (list, tuple)) else None
                hook.check(targets, image_size=sizes)
            return original(self, images, targets, *args, **kwargs)

        return forward

    ledger.wrap(generalized_rcnn.GeneralizedRCNN, "forward", make, mark="__ampsafe_targets__")
    site.tell(f"torchvision GeneralizedRCNN.forward: targets checked first (on_bad_target={policy!r})")
