"""The zero-edit installer behind ``import ampsafe.auto`` (a notebook) and ``ampsafe run``'s child process.

* ``torch.amp.GradScaler`` (also ``torch.amp.grad_scaler.GradScaler``, ``torch.cuda.amp.GradScaler``,
  ``torch.cpu.amp.GradScaler``) and ``paddle.amp.GradScaler`` resolve to ampsafe's scalers, called with the
  script's own arguments plus ampsafe's floor (``min_scale`` / ``min_loss_scaling`` and ``on_floor``);
* the AMP-safe necks are registered in PaddleOCR / PaddleDetection, so swapped configs build;
* every optimizer step no enabled ampsafe scaler guards is guarded (:mod:`ampsafe.run.guard`: a non-finite loss
  or gradient skips the step), and detection targets are checked before the model sees them
  (:mod:`ampsafe.run.targets`: torchvision's ``GeneralizedRCNN``, ppdet's target-building batch transforms);
* with ``emulate_fp16``, ``ampsafe.torch.cuda_emulation`` / ``ampsafe.paddle.amp_emulation`` are installed.

Nothing is imported eagerly: each patch is applied right after the framework's own import finishes (a
post-import hook), so a torch script never pays for paddle. ``summary()`` reports every scaler created.
Options come from ``install(...)`` or, on import, from the ``AMPSAFE_RUN_OPTIONS`` environment variable
(JSON; set by ``ampsafe run``).
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import sys
import threading
from typing import Any, Callable

__all__ = ["install", "uninstall", "summary", "format_summary", "installed", "ENV_OPTIONS", "ENV_REPORT"]

from .launcher import format_summary
from .options import ENV_OPTIONS, ENV_REPORT, RunOptions

_lock = threading.RLock()
_state: dict[str, Any] = {
    "options": None,
    "originals": [],
    "scalers": [],
    "changes": [],
    "watches": [],
    "guards": [],
    "emulators": [],
}
STEP_RECORDS = 100_000  # per scaler: the (step, scale, overflow) records kept for the report's plot
SHIM_MODULE = "ampsafe.auto"  # the module the run's scaler subclasses claim: what a script sees as their type


# --------------------------------------------------------------------------------------------- post-import hook


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a named module has executed (its attributes exist, importers haven't run)."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module, _original=original_exec, _name=name):
            _original(module)
            for callback in self.pending.pop(_name, []):
                callback(module)

        loader.exec_module = exec_module
        return spec


_hook = _AfterImport()


def _when_imported(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else right after it is."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        callback(module)
        return
    _hook.pending.setdefault(name, []).append(callback)
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


def _say(message: str) -> None:
    if not _state["options"].quiet:
        print(f"[ampsafe] {message}", file=sys.stderr, flush=True)


def _set(owner, attr: str, value, label: str) -> None:
    if not hasattr(owner, attr):
        return
    _state["originals"].append((owner, attr, getattr(owner, attr)))
    setattr(owner, attr, value)
    _state["changes"].append(label)


# --------------------------------------------------------------------------------------------- scalers


def _track(scaler, framework: str, user_kwargs: dict) -> None:
    entry = {"scaler": scaler, "framework": framework, "kwargs": user_kwargs, "steps": []}
    with _lock:
        _state["scalers"].append(entry)
    if hasattr(scaler, "add_step_callback"):
        records = entry["steps"]

        def record(decision) -> None:  # the report's per-step plot: step, scale, overflow, floor hit
            if len(records) < STEP_RECORDS:
                records.append((decision.step, float(decision.scale), bool(decision.found_inf), decision.floor_hit))

        scaler.add_step_callback(record)
    if _state["options"].watch:
        _arm_watch(scaler)


def _with_floor(base: type, framework: str, extra: dict, map_device: Callable | None = None) -> type:
    """``base`` with ``ampsafe run``'s floor as default keyword arguments (the script's own arguments win); its
    ``step`` / ``minimize`` tell the FP32 guard that the optimizer steps inside are the scaler's."""
    from .guard import through_scaler

    class GradScaler(base):
        def __init__(self, *args, **kwargs):
            user = dict(kwargs)
            for key, value in extra.items():
                kwargs.setdefault(key, value)
            if map_device is not None:  # --emulate-fp16: a "cuda" scaler scales on the CPU
                if args:
                    args = (map_device(args[0]), *args[1:])
                elif "device" in kwargs:
                    kwargs["device"] = map_device(kwargs["device"])
                else:
                    kwargs["device"] = map_device("cuda")
            super().__init__(*args, **kwargs)
            _track(self, framework, user)

        def step(self, optimizer, *args, **kwargs):
            with through_scaler(self):
                return super().step(optimizer, *args, **kwargs)

        if hasattr(base, "minimize"):

            def minimize(self, optimizer, *args, **kwargs):
                with through_scaler(self):
                    return super().minimize(optimizer, *args, **kwargs)

    GradScaler.__doc__ = (
        f"ampsafe.{framework}.GradScaler with ``ampsafe run``'s floor (the script's own arguments win)."
    )
    GradScaler.__module__ = SHIM_MODULE
    return GradScaler


def _on_device(base: type, device: str) -> type:
    """``torch.{cuda,cpu}.amp.GradScaler``'s signature (no ``device``) on top of ampsafe's scaler."""

    class DeviceGradScaler(base):
        """ampsafe's scaler with the device fixed (``torch.cuda.amp`` / ``torch.cpu.amp`` signature)."""

        def __init__(
            self,
            init_scale=2.0**16,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=2000,
            enabled=True,
            **kwargs,
        ):
            super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled, **kwargs)

    DeviceGradScaler.__name__ = DeviceGradScaler.__qualname__ = f"{device.capitalize()}GradScaler"
    DeviceGradScaler.__module__ = SHIM_MODULE
    return DeviceGradScaler


def _torch_scalers(options: dict, map_device: Callable | None = None):
    from ampsafe.torch.scaler import GradScaler as Base

    scaler = _with_floor(Base, "torch", options.scaler_kwargs("torch"), map_device)
    return scaler, _on_device(scaler, "cuda"), _on_device(scaler, "cpu")


def _emulate(module_name: str) -> Callable | None:
    """--emulate-fp16: install the framework's emulator (another module of this project), print its lines;
    its ``map_device`` when it has one."""
    if not _state["options"].emulate_fp16:
        return None
    try:
        import importlib

        emulator = importlib.import_module(module_name)
    except ImportError as exc:
        _say(f"--emulate-fp16: {module_name} is not available ({exc}); float16 is not emulated")
        return None
    for line in emulator.install() or []:
        _state["changes"].append(line)
        _say(line)
    _state["emulators"].append(emulator)
    return getattr(emulator, "map_device", None)


def _emulate_ppdet(module) -> None:
    from ampsafe.paddle import amp_emulation

    for line in amp_emulation.install_ppdet(module):
        _state["changes"].append(line)
        _say(line)


def _guard(framework: str, install_fn: Callable, module) -> None:
    """The FP32 guard of one framework's optimizers (:mod:`ampsafe.run.guard`)."""
    from .._framework import backend_named
    from .guard import StepGuard

    options = _state["options"]
    guard = StepGuard(
        backend_named(framework), None, None, max_skips=options.max_skips, watch=options.watch, say=_say
    )
    line = install_fn(module, guard, _set_attr)
    _state["guards"].append(guard)
    _state["changes"].append(line)
    _say(line)


def _set_attr(owner, attr: str, value) -> None:
    """Patch one attribute, restored by :func:`uninstall` (the caller reports the change in its own words)."""
    if hasattr(owner, attr):
        _state["originals"].append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)


def _patch_torch(torch) -> None:
    options = _state["options"]
    map_device = _emulate("ampsafe.torch.cuda_emulation")
    scaler, cuda_scaler, cpu_scaler = _torch_scalers(options, map_device)
    floor = options.scaler_text("torch")
    import torch.amp.grad_scaler  # noqa: F401 (make sure the submodules exist before patching them)

    _set(torch.amp, "GradScaler", scaler, f"torch.amp.GradScaler -> ampsafe.torch.GradScaler ({floor})")
    _set(torch.amp.grad_scaler, "GradScaler", scaler, "torch.amp.grad_scaler.GradScaler -> ampsafe.torch.GradScaler")
    try:
        import torch.cuda.amp as cuda_amp

        _set(cuda_amp, "GradScaler", cuda_scaler, "torch.cuda.amp.GradScaler -> ampsafe.torch.GradScaler")
    except ImportError:
        pass
    try:
        import torch.cpu.amp as cpu_amp

        _set(cpu_amp, "GradScaler", cpu_scaler, "torch.cpu.amp.GradScaler -> ampsafe.torch.GradScaler")
    except ImportError:
        pass
    _say(f"torch.amp / torch.cuda.amp / torch.cpu.amp GradScaler -> ampsafe.torch.GradScaler ({floor})")
    from .guard import install_torch

    _guard("torch", install_torch, torch)


def _patch_paddle(paddle) -> None:
    options = _state["options"]
    _emulate("ampsafe.paddle.amp_emulation")
    from .guard import install_paddle

    _guard("paddle", install_paddle, paddle)
    try:
        from ampsafe.paddle.scaler import GradScaler as Base
    except ImportError as exc:  # the Paddle scaler is another module of this project
        _say(f"paddle.amp.GradScaler left as is: ampsafe.paddle.scaler unavailable ({exc})")
        return
    GradScaler = _with_floor(Base, "paddle", options.scaler_kwargs("paddle"))
    floor = options.scaler_text("paddle")
    _set(paddle.amp, "GradScaler", GradScaler, f"paddle.amp.GradScaler -> ampsafe.paddle.GradScaler ({floor})")
    grad_scaler = sys.modules.get("paddle.amp.grad_scaler")
    if grad_scaler is not None:
        _set(grad_scaler, "GradScaler", GradScaler, "paddle.amp.grad_scaler.GradScaler -> ampsafe.paddle.GradScaler")
    _say(f"paddle.amp.GradScaler -> ampsafe.paddle.GradScaler ({floor})")


# --------------------------------------------------------------------------------------------- necks, watch


def _register_ocr(_module) -> None:
    from ampsafe.patches import register_paddleocr
    from ampsafe.patches.register import ppocr_registration_line

    done = register_paddleocr()
    if done.get("ppocr"):
        _state["changes"].append(f"safe necks registered in PaddleOCR's ppocr: {', '.join(sorted(done['ppocr']))}")
        _say(ppocr_registration_line(done))


def _targets_torchvision(module) -> None:
    from .targets import patch_torchvision

    line = patch_torchvision(module, _state["options"].on_bad_target, _set_attr)
    _state["changes"].append(line)
    _say(line)


def _targets_ppdet(module) -> None:
    from .targets import patch_ppdet

    line = patch_ppdet(module, _state["options"].on_bad_target, _set_attr)
    _state["changes"].append(line)
    _say(line)


def _register_det(_module) -> None:
    from ampsafe.patches import register_paddledet

    names = register_paddledet()
    _state["changes"].append(f"ppdet necks registered: {', '.join(names)}")
    _say(f"ppdet necks registered: {', '.join(names)}")


def _arm_watch(scaler) -> None:
    """--watch: on the first ``scale(loss)``, find the model being trained and keep ``ampsafe.watch`` on it."""
    original = scaler.scale

    def scale(outputs, *args, **kwargs):
        scaler.scale = original
        model = _find_model(scaler)
        if model is not None:
            try:
                import ampsafe

                ctx = ampsafe.watch(model)
                # entered after this step's forward: its next forward is the scaler's next step, and the
                # watcher numbers passes as the scaler numbers steps (stats.total_steps, from 0)
                if hasattr(ctx, "_forward_count"):
                    ctx._forward_count = scaler.stats.total_steps + 1
                ctx.__enter__()
                _state["watches"].append(ctx)
                _say(f"watching {type(model).__name__} for NaN/Inf")
            except Exception as exc:  # the sentinel is optional here: training goes on without it
                _say(f"--watch unavailable: {type(exc).__name__}: {exc}")
        return original(outputs, *args, **kwargs)

    scaler.scale = scale


def _find_model(scaler):
    """The model being trained: the scaler's own, else the owner of an optimizer's parameters (found as the
    scalers find it, ``Backend.owner_of``), else the live root module with the most parameters."""
    model = getattr(scaler, "model", None) or getattr(scaler, "_model", None)  # resolved, else model=
    if model is not None:
        return model
    for guard in _state["guards"]:
        models = guard.models()
        if models:
            return models[0]
    from .._framework import imported_backends
    from ..core.backend import live_roots

    roots = [(b, m) for b in imported_backends() for m in live_roots(b)]
    best = max(roots, key=lambda bm: len(bm[0].parameters(bm[1])), default=None)
    return best[1] if best is not None else None


# --------------------------------------------------------------------------------------------- public


def install(
    *,
    on_floor: str = "heal",
    min_scale: float = 1.0,
    watch: bool = False,
    quiet: bool = False,
    max_skips: int = 10,
    on_bad_target: str = "raise",
    report: str | None = None,
    emulate_fp16: bool = False,
) -> RunOptions:
    """Put ampsafe in place and return the options in force (a :class:`~ampsafe.run.options.RunOptions`).

    A second call with the same options changes nothing; a call with other options (``import ampsafe.auto``
    has already installed the defaults) undoes the first installation and installs again with them, so the
    options in force are always the last ones asked for. Scalers built before keep the floor they were built with.

    The options of ``ampsafe run`` (``on_floor`` heal|raise|clamp, ``min_scale``, ``watch``, ``max_skips``,
    ``on_bad_target`` raise|drop, ``emulate_fp16``); ``report`` is written by ``ampsafe run``'s parent
    process (in a notebook: ``ampsafe.run.report.write_reports([summary()], dir)``). A bad value raises
    :class:`ampsafe.ConfigError` naming it, and the options in force stay as they were.
    """
    options = RunOptions(
        on_floor=on_floor,
        min_scale=min_scale,
        watch=watch,
        quiet=quiet,
        max_skips=max_skips,
        on_bad_target=on_bad_target,
        report=report,
        emulate_fp16=emulate_fp16,
    )
    return install_options(options)


def install_options(options: RunOptions) -> RunOptions:
    """:func:`install` with the options as one value (what ``ampsafe run``'s child reads from its environment)."""
    with _lock:
        if _state["options"] == options:
            return options
        if _state["options"] is not None:
            uninstall()
            _state["guards"].clear()
            _state["changes"].clear()
        _state["options"] = options
        _when_imported("torch", _patch_torch)
        _when_imported("paddle", _patch_paddle)
        _when_imported("torchvision.models.detection.generalized_rcnn", _targets_torchvision)
        _when_imported("ppdet.data.transform.batch_operators", _targets_ppdet)
        _when_imported("ppdet", _register_det)
        if options.emulate_fp16:  # ppdet's Trainer passes enable=cfg.use_gpu (amp_emulation)
            _when_imported("ppdet.engine.trainer", _emulate_ppdet)
        _when_imported("ppocr.modeling.necks", _register_ocr)
        return options


def uninstall() -> None:
    """Restore every patched attribute and drop pending hooks (registered necks stay registered)."""
    with _lock:
        for owner, attr, value in reversed(_state["originals"]):
            setattr(owner, attr, value)
        _state["originals"].clear()
        _hook.pending.clear()
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        for ctx in _state["watches"]:
            ctx.__exit__(None, None, None)
        _state["watches"].clear()
        for guard in _state["guards"]:
            guard.enabled = False  # the optimizer classes it wrapped pass straight through from now on
        for emulator in reversed(_state["emulators"]):
            emulator.uninstall()
        _state["emulators"].clear()
        _state["options"] = None


def installed() -> bool:
    return _state["options"] is not None


def _disabled_reason(scaler) -> str | None:
    """Why the scaler does nothing (the scaler's own ``disabled_reason``), or None when it scales or guards."""
    from .guard import scaler_guards

    reason = getattr(scaler, "disabled_reason", None)
    if reason is None and not scaler_guards(scaler):
        reason = "disabled (the scaler reports itself disabled)"
    return reason


def summary() -> dict:
    """What ampsafe changed, and per scaler created: its class, framework, the script's own arguments and stats."""
    rows = []
    for entry in _state["scalers"]:
        scaler = entry["scaler"]
        stats = scaler.stats.to_dict() if hasattr(scaler.stats, "to_dict") else dict(vars(scaler.stats))
        scale = None
        for getter in ("get_scale", "get_loss_scaling"):
            if hasattr(scaler, getter):
                try:
                    value = getattr(scaler, getter)()
                    scale = float(value.item() if hasattr(value, "item") else value)
                except Exception:
                    scale = None
                break
        heal_records = [
            {"step": h.get("step"), "paths": list(h.get("paths", ()))} if isinstance(h, dict) else h
            for h in stats.get("heals", [])
        ]
        stats["heals"] = len(heal_records)
        stats["scale_history"] = list(stats.get("scale_history", []))[-5:]
        base = next(c for c in type(scaler).__mro__ if c.__module__ != SHIM_MODULE)  # ampsafe's class, not the shim
        model = getattr(scaler, "model", None) or getattr(scaler, "_model", None)
        rows.append(
            {
                "class": f"{base.__module__}.{base.__name__}",
                "framework": entry["framework"],
                "script_kwargs": {k: repr(v) for k, v in entry["kwargs"].items()},
                "scale": scale,
                "disabled_reason": _disabled_reason(scaler),
                "model": type(model).__name__ if model is not None else None,
                "heal_records": heal_records,
                "steps": list(entry["steps"]),
                **stats,
            }
        )
    from .targets import stats as target_stats

    return {
        "pid": os.getpid(),
        "options": _state["options"].to_dict() if _state["options"] is not None else None,
        "changes": list(_state["changes"]),
        "scalers": rows,
        "guards": [g.to_dict() for g in _state["guards"]],
        "targets": target_stats(),
    }


def _write_report() -> None:
    directory = os.environ.get(ENV_REPORT)
    if not directory or _state["options"] is None:
        return
    try:
        with open(os.path.join(directory, f"{os.getpid()}.json"), "w", encoding="utf-8") as fh:
            json.dump(summary(), fh, default=repr)
    except OSError as exc:
        print(f"[ampsafe] could not write the run report: {exc}", file=sys.stderr)


def _from_env() -> RunOptions:
    """``ampsafe run``'s options (``AMPSAFE_RUN_OPTIONS``), or the defaults; a malformed value is refused."""
    return RunOptions.from_env()


def install_from_env() -> RunOptions:
    """Install with ``ampsafe run``'s options (``AMPSAFE_RUN_OPTIONS``), and write this process's summary at exit."""
    options = install_options(_from_env())
    atexit.register(_write_report)
    return options
