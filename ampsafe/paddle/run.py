"""What ``ampsafe run``'s child puts in place in Paddle, right after paddle is imported: :func:`install`, called by
``PaddleBackend.install_run``.

In this order:

* ``--emulate-fp16``: :mod:`ampsafe.paddle.amp_emulation` (Paddle's AMP as float16 AMP on a CPU place); once
  PaddleDetection's trainer is imported, its ``amp`` Trainer too (``install_ppdet``);
* the FP32 guard: every ``paddle.optimizer.Optimizer`` subclass's ``step`` and ``minimize(loss)`` are guarded at
  its first construction, and every ``Tensor.backward`` notes its loss;
* ``paddle.amp.GradScaler`` and ``paddle.amp.AmpScaler`` (also in ``paddle.amp.grad_scaler``) resolve to
  :class:`ampsafe.paddle.GradScaler` with the run's floor, as its ``amp.scaler_args`` spell it for
  Paddle (``min_loss_scaling``); ``AmpScaler`` keeps its own defaults;
* once ppdet's batch transforms are imported, the ones that turn ``gt_bbox`` into targets check the boxes first.

Every patch goes through the run's ledger (:class:`~ampsafe.core.ledger.AttrPatches`), so
``ampsafe.auto.uninstall()`` undoes all of it. The run's framework-neutral pieces come in ``site`` (see
``Backend.install_run``): this package is below ``ampsafe.run`` and never imports it.
"""

from __future__ import annotations

import sys
from typing import Any

from .backend import BACKEND

__all__ = ["install", "PPDET_BATCH_TRANSFORMS"]

# ppdet's batch transforms that read gt_bbox, and the box format they read it in (ppdet 2.6.0's sources)
PPDET_BATCH_TRANSFORMS = {
    "Gt2YoloTarget": "cxcywh",  # after BboxXYXY2XYWH + NormalizeBox: gx, gy, gw, gh
    "Gt2FCOSTarget": "xyxy",
    "Gt2GFLTarget": "xyxy",
    "Gt2TTFTarget": "xyxy",
    "Gt2Solov2Target": "xyxy",
    "Gt2CenterNetTarget": "xyxy",
}


def install(options, ledger, site) -> None:
    """Put ``ampsafe run``'s Paddle hooks in place (``options``: a :class:`~ampsafe.run.options.RunOptions`)."""
    _emulate(options, ledger, site)
    _guard_optimizers(ledger, site)
    _swap_scalers(options, ledger, site)
    site.when_imported(
        "ppdet.data.transform.batch_operators",
        lambda module: _check_targets(module, options.on_bad_target, ledger, site),
    )


def _emulate(options, ledger, site) -> None:
    if not options.emulate_fp16:
        return
    from . import amp_emulation

    for line in amp_emulation.install():
        site.tell(line)
    ledger.on_restore(amp_emulation.uninstall)

    def ppdet_trainer(module) -> None:
        # ppdet's Trainer passes enable=cfg.use_gpu to its scaler and every auto_cast: false on a CPU build
        for line in amp_emulation.install_ppdet(module):
            site.tell(line)

    for name in amp_emulation.PPDET_TRAINER_MODULES:
        site.when_imported(name, ppdet_trainer)


def _swap_scalers(options, ledger, site) -> None:
    import paddle

    try:
        from .scaler import GradScaler, amp_scaler
    except ImportError as exc:  # what a broken Paddle install looks like: training goes on with Paddle's scaler
        site.say(f"paddle.amp.GradScaler left as is: ampsafe.paddle.scaler unavailable ({exc})")
        return
    native = sys.modules.get("paddle.amp.grad_scaler")
    scaler = site.scaler_class(
        GradScaler,
        BACKEND,
        scale=GradScaler.get_loss_scaling,
        guards=lambda s: s._guard or s.is_enable(),  # scaling, or ampsafe's own FP32 guard mode
        steps=("step", "minimize"),
        replaces=getattr(native, "GradScaler", None),
    )
    # AmpScaler built as a scaler: its own defaults (init_loss_scaling=2**15, incr_every_n_steps=1000)
    amp = site.shim(amp_scaler(scaler), getattr(native, "AmpScaler", None))
    floor = options.scaler_text(BACKEND.amp.scaler_args)

    def swap(owner, attr: str, value, label: str) -> None:
        site.swap(ledger, owner, attr, value, label)

    swap(paddle.amp, "GradScaler", scaler, f"paddle.amp.GradScaler -> ampsafe.paddle.GradScaler ({floor})")
    swap(paddle.amp, "AmpScaler", amp, f"paddle.amp.AmpScaler -> ampsafe.paddle.GradScaler ({floor})")
    if native is not None:
        swap(native, "GradScaler", scaler, "paddle.amp.grad_scaler.GradScaler -> ampsafe.paddle.GradScaler")
        swap(native, "AmpScaler", amp, "paddle.amp.grad_scaler.AmpScaler -> ampsafe.paddle.GradScaler")
    site.say(f"paddle.amp.GradScaler / AmpScaler -> ampsafe.paddle.GradScaler ({floor})")


def _guard_optimizers(ledger, site) -> None:
    import paddle

    from .grads import nonfinite_params

    guard = site.step_guard(BACKEND, nonfinite_params)
    guard.training = lambda model: model.training and paddle.is_grad_enabled()

    def no_loss(args, kwargs):
        return None

    def minimize_loss(args, kwargs):
        return args[0] if args else kwargs.get("loss")

    def no_closure(args, kwargs):
        return None

    def wrap_class(cls) -> None:
        guard.wrap_step(cls, "step", loss_of=no_loss, closure_of=no_closure)
        # Paddle's minimize returns (optimize_ops, params_grads), which its GradScaler.minimize unpacks
        guard.wrap_step(cls, "minimize", loss_of=minimize_loss, closure_of=no_closure, skipped=lambda: (None, []))

    guard.low_precision = _float16_amp
    guard.add_scaler = _add_scaler
    guard.guard_new_optimizers(paddle.optimizer.Optimizer, wrap_class)
    guard.note_losses(paddle.Tensor)
    site.tell(
        "paddle.optimizer.Optimizer step/minimize guarded without a scaler (skip non-finite; "
        f"max_skips={guard.max_skips})"
    )


def _float16_amp() -> str | None:
    """Why a forward starting now computes in float16 (ampsafe's float16 emulation, or ``auto_cast`` at O1/O2 with
    float16 where Paddle has float16 kernels), or None."""
    import paddle

    emulator, level, dtype = BACKEND.amp.state()
    if emulator is not None:
        return f"float16 auto_cast {emulator.level} (emulated)"
    if level in ("O1", "O2") and dtype == "float16" and paddle.device.is_compiled_with_cuda():
        return f"float16 auto_cast {level}"
    return None


def _add_scaler(optimizer) -> dict:
    """Paddle's lines that add a GradScaler to a float16 loop without one (an ``AddScaler`` record as a dict)."""
    import paddle

    half = any(p.dtype == paddle.float16 for p in BACKEND.optimizer_params(optimizer))
    note = "or `scaler.minimize(optimizer, scaler.scale(loss))` in place of `step` and `update` (Paddle's own form)"
    if half:
        note += (
            "; float16 parameters need float32 master weights: build them with "
            '`model, optimizer = paddle.amp.decorate(model, optimizer, level="O2")`'
        )
    return {
        "framework": "paddle",
        "create": "scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**16)",
        "backward": "scaler.scale(loss).backward()",
        "step": "scaler.step(optimizer)",
        "update": "scaler.update()",
        "replaces_backward": "loss.backward()",
        "replaces_step": "optimizer.step()",
        "note": note,
    }


def _check_targets(batch_operators, policy: str, ledger, site) -> None:
    """ppdet's batch transforms that turn ``gt_bbox`` into targets check the boxes as they read them:
    ``Gt2YoloTarget`` silently drops a zero-width box and crashes on a NaN centre."""
    names = []
    for name, box_format in PPDET_BATCH_TRANSFORMS.items():
        cls = getattr(batch_operators, name, None)
        if cls is None:
            continue
        hook = site.target_hook(f"ppdet {name}", policy)

        def make(original, _hook=hook, _format=box_format):
            def __call__(self, samples, context=None, *args: Any, **kwargs: Any):
                items = samples if isinstance(samples, (list, tuple)) else [samples]
                items = [s for s in items if isinstance(s, dict) and "gt_bbox" in s]
                if items:
                    _hook.check(items, box_format=_format, padded=True)  # PadBox's zero rows are padding
                return original(self, samples, context, *args, **kwargs)

            return __call__

        ledger.wrap(cls, "__call__", make, mark="__ampsafe_targets__")
        names.append(name)
    site.tell(f"ppdet {', '.join(names)}: gt_bbox checked first (on_bad_target={policy!r})")
