"""The zero-edit installer behind ``import ampsafe.auto`` (a notebook) and ``ampsafe run``'s child process.

* ``torch.amp.GradScaler`` (also ``torch.amp.grad_scaler.GradScaler``, ``torch.cuda.amp.GradScaler``,
  ``torch.cpu.amp.GradScaler``) and ``paddle.amp.GradScaler`` resolve to ampsafe's scalers, called with the
  script's own arguments plus ampsafe's floor (``min_scale`` / ``min_loss_scaling`` and ``on_floor``);
* the AMP-safe necks are registered in PaddleOCR / PaddleDetection, so swapped configs build;
* every optimizer step no enabled ampsafe scaler guards is guarded (:mod:`ampsafe.run.guard`: a non-finite loss
  or gradient skips the step), and detection targets are checked before the model sees them
  (:mod:`ampsafe.run.targets`: torchvision's ``GeneralizedRCNN``, ppdet's target-building batch transforms);
* with ``emulate_fp16``, ``ampsafe.torch.cuda_emulation`` / ``ampsafe.paddle.amp_emulation`` are installed.

What a framework needs patched is its own backend's to do, so no framework's code lives here: right after a
registered framework's own import finishes (a post-import hook), its ``Backend.install_run(options, ledger, site)``
runs (:mod:`ampsafe.torch.run`, :mod:`ampsafe.paddle.run`), so a torch script never pays for paddle. It is handed
the options, the run's :class:`~ampsafe.core.attr_patches.AttrPatches` (every patch of the run is recorded there,
and :func:`uninstall` undoes them all) and :class:`_Site`, the run's framework-neutral pieces.
``summary()`` reports every scaler created.
Options come from ``install(...)`` or, on import, from the ``AMPSAFE_RUN_OPTIONS`` environment variable
(JSON; set by ``ampsafe run``).
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import logging
import os
import re
import sys
import threading
from typing import Any, Callable

__all__ = ["install", "uninstall", "summary", "format_summary", "installed", "ENV_OPTIONS", "ENV_REPORT"]

from ..core.attr_patches import AttrPatches
from ..core.modpath import outermost
from ..policies.island import island_modules
from .launcher import format_summary
from .options import ENV_OPTIONS, ENV_REPORT, RunOptions

_lock = threading.RLock()
_state: dict[str, Any] = {
    "options": None,
    "patches": AttrPatches("ampsafe run"),  # every patch of the run (torch, Paddle, trainers), undone by uninstall()
    "scalers": [],
    "changes": [],
    "watches": [],
    "guards": [],
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


# --------------------------------------------------------------------------------------------- scalers


def _track(scaler, framework: str, user_kwargs: dict) -> None:
    entry = {"scaler": scaler, "framework": framework, "kwargs": user_kwargs, "steps": []}
    with _lock:
        _state["scalers"].append(entry)
    if hasattr(scaler, "add_step_callback"):
        records = entry["steps"]

        def record(decision) -> None:  # the report's per-step plot: step, scale, overflow, floor hit
            if "holder" not in entry:  # the first step: the scaler has resolved its model, still alive now
                _note_holder(scaler, entry)
            if len(records) < STEP_RECORDS:
                records.append((decision.step, float(decision.scale), bool(decision.found_inf), decision.floor_hit))

        scaler.add_step_callback(record)
        scaler.add_step_callback(_backoff_scan(scaler, entry))
        scaler.add_step_callback(_hf_follow(scaler))
    if _state["options"].watch:
        _arm_watch(scaler)


def _reloaded(scaler, before: float | None) -> None:
    """The scaler's state was loaded from a checkpoint: an event of the run (the report lists it)."""
    entry = next((e for e in _state["scalers"] if e["scaler"] is scaler), None)
    if entry is None:
        return
    steps = entry["steps"]
    event = {"after_step": steps[-1][0] if steps else None, "scale_before": before, "scale_after": scaler._run_scale()}
    entry.setdefault("reloads", []).append(event)
    _say(
        f"the script loaded its GradScaler's state (a checkpoint reload) after step {event['after_step']}: scale "
        f"{before} -> {event['scale_after']}; the run's counters and heal records are kept"
    )


def _note_holder(scaler, entry: dict) -> None:
    """The object the user holds around the scaler's model and the model's path in it
    (:mod:`ampsafe.run.holder`): the report's paths are made relative to it."""
    entry["holder"], entry["holder_path"] = None, ""
    model = getattr(scaler, "model", None)
    if model is None or not hasattr(scaler, "_backend"):
        return
    from .holder import holder_of

    holder, path = holder_of(scaler._backend(), model)
    entry["holder"] = type(holder).__name__ if holder is not None else None
    entry["holder_path"] = path


BACKOFF_SCAN_AT = 3  # overflowing steps above the floor before the report's scan looks at the batch


def _island_levels(framework: str) -> dict:
    """level -> [where, advice] of the framework's levels whose island line differs (``Amp.island_levels``), as
    the report reads them from the summary (JSON)."""
    from .._framework import backend_named

    return {level: list(words) for level, words in backend_named(framework).amp.island_levels.items()}


def _backoff_scan(scaler, entry: dict) -> Callable:
    """Many backoffs without a floor hit are lost steps the summary counts; at the ``BACKOFF_SCAN_AT``-th one
    the step's batch (the scaler's capture, still held during ``update()``) is scanned once, so the report can
    name the paths near float16's edge and the island line for them (``entry["backoff_scan"]``)."""
    seen = [0]

    def on_step(decision) -> None:
        if not decision.found_inf or decision.floor_hit or "backoff_scan" in entry:
            return
        seen[0] += 1
        if seen[0] < BACKOFF_SCAN_AT:
            return
        entry["backoff_scan"] = result = {"step": decision.step, "paths": [], "modules": []}
        model, capture = getattr(scaler, "model", None), getattr(scaler, "capture", None)
        latest = capture.latest if capture is not None else None
        if model is None or latest is None or latest[1]:
            result["error"] = "no captured batch to scan" if latest is None or model is None else "keyword inputs"
            return
        try:
            import ampsafe

            with capture.paused():
                report = ampsafe.scan(model, latest[0])
        except Exception as exc:  # the scan is advice for the report: a failure is reported, training goes on
            result["error"] = f"{type(exc).__name__}: {exc}"[:300]
            return
        risky = [p for p in report.paths if p.risky and not p.protected]
        result["paths"] = [p.start for p in risky]
        # the modules policy "island" would island for these paths (a container only when its own forward needs
        # float32): the report's island line is that patch
        backend = scaler._backend() if hasattr(scaler, "_backend") else None
        mods = [m for p in risky for m in island_modules(p, report.level, backend) if m]
        result["modules"] = outermost(mods)

    return on_step


class _Alias(type):
    """The metaclass of the classes ``ampsafe run`` puts in place of a framework's scaler class: ``isinstance`` /
    ``issubclass`` against the patched name also answer as against the class it replaced (``_replaces``), so a
    scaler the framework or a library built before (or ampsafe's own, built directly) still passes a library's
    ``isinstance(scaler, torch.amp.GradScaler)`` check."""

    _replaces: type | None = None

    def __instancecheck__(cls, obj) -> bool:
        return type.__instancecheck__(cls, obj) or (cls._replaces is not None and isinstance(obj, cls._replaces))

    def __subclasscheck__(cls, sub) -> bool:
        return type.__subclasscheck__(cls, sub) or (cls._replaces is not None and issubclass(sub, cls._replaces))


def _with_floor(
    base: type,
    framework: str,
    defaults: dict,
    *,
    scale: Callable,
    guards: Callable,
    steps: tuple[str, ...],
    map_device: Callable | None = None,
    replaces: type | None = None,
) -> type:
    """``base`` (ampsafe's scaler of ``framework``) with ``ampsafe run``'s floor as default keyword arguments
    (``defaults``; the script's own arguments win). The framework says what only it knows: ``scale(scaler)`` its
    current scale, ``guards(scaler)`` whether it checks its optimizer's gradients itself, ``steps`` the methods
    inside which the optimizer steps are the scaler's (the FP32 guard lets them through), ``map_device`` the device
    a "cuda" scaler really scales on (``--emulate-fp16``). ``replaces``: the framework class it stands for
    (``isinstance`` against it still holds, see :class:`_Alias`)."""

    class GradScaler(base, metaclass=_Alias):
        def __init__(self, *args, **kwargs):
            user = dict(kwargs)
            for key, value in defaults.items():
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

        def load_state_dict(self, state_dict, *args, **kwargs):
            """A trainer reloading a checkpoint mid-run (ultralytics' NaN recovery reloads ``last.pt``) loads
            the scale state (the run's counters and heal records are not part of it); the reload is an event."""
            before = self._run_scale()
            result = super().load_state_dict(state_dict, *args, **kwargs)
            _reloaded(self, before)
            return result

        def _run_scale(self) -> float | None:
            """The current scale, or None when the scaler cannot say (the report's number)."""
            try:
                return float(scale(self))
            except Exception:  # noqa: BLE001 - an inactive scaler: no scale
                return None

        def _run_guards(self) -> bool:
            return bool(guards(self))

    for name in steps:
        setattr(GradScaler, name, _through_scaler(GradScaler, name))
    GradScaler.__doc__ = (
        f"ampsafe.{framework}.GradScaler with ``ampsafe run``'s floor (the script's own arguments win)."
    )
    return _shim(GradScaler, replaces)


def _through_scaler(cls: type, name: str) -> Callable:
    """``cls.<name>(optimizer, ...)`` run inside :func:`~ampsafe.run.guard.through_scaler`: the FP32 guard lets
    the optimizer steps inside it through when the scaler guards them itself."""
    from .guard import through_scaler

    def method(self, optimizer, *args, **kwargs):
        with through_scaler(self._run_guards()):
            return getattr(super(cls, self), name)(optimizer, *args, **kwargs)

    method.__name__, method.__qualname__ = name, f"{cls.__qualname__}.{name}"
    return method


def _shim(cls: type, replaces: type | None) -> type:
    """A class the run puts in place of a framework's: it claims :data:`SHIM_MODULE` (what a script sees as its
    type) and answers ``isinstance`` for the class it ``replaces``."""
    cls.__module__ = SHIM_MODULE
    cls._replaces = replaces
    return cls


def _integrate(name: str, module) -> None:
    """--emulate-fp16: one trainer's integration (:mod:`ampsafe.run.integrations`); its lines go to the banner."""
    from .integrations import apply

    def tell(line: str) -> None:
        if line not in _state["changes"]:
            _state["changes"].append(line)
            _say(line)

    tell(apply(name, module, _set_attr, tell))


def _set_attr(owner, attr: str, value) -> None:
    """Patch one attribute, restored by :func:`uninstall` (the caller reports the change in its own words)."""
    if hasattr(owner, attr):
        _state["patches"].set(owner, attr, value)


class _Site:
    """What a framework's ``install_run(options, ledger, site)`` gets besides the options and the ledger: the run's
    framework-neutral pieces, which live in this front end and so cannot be imported by an adapter package."""

    def say(self, line: str) -> None:
        """A line for the banner (stderr) only."""
        _say(line)

    def note(self, line: str) -> None:
        """A line for the summary's list of changes only (one per patched attribute)."""
        _state["changes"].append(line)

    def tell(self, line: str) -> None:
        """A line for both."""
        self.note(line)
        self.say(line)

    def swap(self, ledger, owner, attr: str, value, label: str) -> None:
        """``owner.attr = value`` (recorded in ``ledger``) where ``owner`` has that attribute, ``label`` noted in
        the summary: a framework version without one of the spellings keeps going."""
        if owner is not None and hasattr(owner, attr):
            ledger.set(owner, attr, value)
            self.note(label)

    def when_imported(self, name: str, callback: Callable) -> None:
        """``callback(module)`` right after module ``name`` is imported (now if it is)."""
        _when_imported(name, callback)

    def scaler_class(self, base: type, framework: str, **how) -> type:
        """The class the run puts in place of ``framework``'s GradScaler: see :func:`_with_floor`."""
        return _with_floor(base, framework, **how)

    def shim(self, cls: type, replaces: type | None) -> type:
        """Another spelling built on :meth:`scaler_class`'s class (``torch.cuda.amp``'s, Paddle's ``AmpScaler``):
        its type claims ``ampsafe.auto``, ``isinstance`` answers for ``replaces``."""
        return _shim(cls, replaces)

    def step_guard(self, backend, finite: Callable, offenders: Callable):
        """The FP32 guard of ``backend``'s optimizers (:class:`~ampsafe.run.guard.StepGuard`), with the run's
        options; it records the optimizer classes it wraps in the run's ledger."""
        from .guard import StepGuard

        options = _state["options"]
        guard = StepGuard(
            backend,
            finite,
            offenders,
            max_skips=options.max_skips,
            watch=options.watch,
            say=_say,
            patches=_state["patches"],
        )
        _state["guards"].append(guard)
        return guard

    def target_hook(self, where: str, policy: str):
        """A :class:`~ampsafe.run.targets.TargetHook`: checks the boxes of one entry point, counted in the summary."""
        from .targets import TargetHook

        return TargetHook(where, policy)


_SITE = _Site()


def _install_framework(name: str) -> None:
    """The registered framework ``name`` has just been imported: its backend puts the run's hooks in place."""
    from .._framework import backend_named

    backend_named(name).install_run(_state["options"], _state["patches"], _SITE)


# --------------------------------------------------------------------------------------------- necks, watch


def _register_ocr(_module) -> None:
    from ampsafe.patches import register_paddleocr
    from ampsafe.patches.register import ppocr_registration_line

    done = register_paddleocr()
    if done.get("ppocr"):
        _state["changes"].append(f"safe necks registered in PaddleOCR's ppocr: {', '.join(sorted(done['ppocr']))}")
        _say(ppocr_registration_line(done))


def _register_det(_module) -> None:
    from ampsafe.patches import register_paddledet

    names = register_paddledet()
    _state["changes"].append(f"ppdet necks registered: {', '.join(names)}")
    _say(f"ppdet necks registered: {', '.join(names)}")


def _arm_watch(scaler) -> None:
    """--watch under a scaler: ``ampsafe.watch`` on the trained model, from its next forward (step 0 when the
    optimizer came first, as scripts build them), else from the scaler's first update.

    A dynamic loss scale absorbs a backward overflow: the step is skipped and the scale backs off. So the run
    stops only on what the scaler cannot absorb: a non-finite forward value (any scale), a backward overflow at
    the floor, a non-finite gradient that unscaling would not make finite (NaN, or an op that ran in float32).
    Routine backoffs are counted (``watch_backoffs`` in the summary) and each named in one line. Nothing on the
    scaler instance is replaced: the watcher hears the steps through the scaler's step callbacks.
    """
    entry = next(e for e in _state["scalers"] if e["scaler"] is scaler)
    entry.update(watch_backoffs=[], watch_model=None)
    if _disabled_reason(scaler) is not None:  # its steps are the FP32 guard's, whose --watch replays a skipped one
        return
    pending: list = []  # this step's backward event, decided at the scaler's update

    def on_event(error) -> None:
        if error.phase == "forward":
            raise error
        pending.append(error)

    def start(model) -> None:
        try:
            import ampsafe

            _quiet_backward_records()
            ctx = ampsafe.watch(model, on_nonfinite="record", callback=on_event)
            # passes are numbered as the scaler numbers its steps (optimizer steps, from 0)
            ctx.step_source = lambda: scaler.stats.total_steps + getattr(scaler, "_lag", 0)
            ctx.__enter__()
        except Exception as exc:  # the sentinel is optional here: training goes on without it
            _say(f"--watch unavailable: {type(exc).__name__}: {exc}")
            return
        _state["watches"].append(ctx)
        entry["watch_model"] = type(model).__name__
        _say(f"watching {type(model).__name__} for NaN/Inf (routine loss-scale backoffs are counted, not raised)")

    def on_step(decision) -> None:
        if entry["watch_model"] is None:
            model = _find_model(scaler)
            if model is not None:
                start(model)
            return
        events, pending[:] = list(pending), []
        if not decision.found_inf:
            return
        from ..core.sentinel import OVERFLOW

        event = events[0] if events else None
        if event is not None and event.kind != OVERFLOW and not _ran_low(event):
            event.add_note(
                f"ampsafe run --watch: a non-finite gradient no loss scale makes finite (step {decision.step})"
            )
            raise event
        if decision.floor_hit:
            if event is None:
                return  # the scaler's own floor handling (heal / raise / clamp) speaks for it
            event.add_note(
                f"ampsafe run --watch: step {decision.step} overflowed at the loss-scale floor ({decision.scale:g})"
            )
            raise event
        where = f"{event.module or '<root>'}:{event.op}" if event is not None else "an unhooked op"
        entry["watch_backoffs"].append({"step": decision.step, "scale": decision.scale, "where": where})
        if len(entry["watch_backoffs"]) <= 5:
            _say(
                f"step {decision.step}: backward overflow in {where} at scale {decision.scale:g}: routine, the "
                f"scaler skipped the step and backs off to {decision.next_scale:g}"
                + (" (further backoffs are counted in the summary)" if len(entry["watch_backoffs"]) == 5 else "")
            )

    if hasattr(scaler, "add_step_callback"):
        scaler.add_step_callback(on_step)
    model = _find_model(scaler)
    if model is not None:
        start(model)


class _DecidedEvents(logging.Filter):
    """The watcher logs each recorded event; under ``ampsafe run --watch`` each is decided where it happens (a
    forward one raised, a backward one raised at the step or counted as a routine backoff with its own line),
    so its log record would only repeat it."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ..errors import NonFiniteError

        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and isinstance(args[0], NonFiniteError))


def _quiet_backward_records() -> None:
    logger = logging.getLogger("ampsafe.watch")
    if not any(isinstance(f, _DecidedEvents) for f in logger.filters):
        logger.addFilter(_DecidedEvents())


def _ran_low(event) -> bool:
    """Whether a backward event's op ran in float16/bfloat16 (real or emulated), as its message states: a NaN
    born there (inf - inf of an overflowed gradient) goes away at a smaller scale like an overflow does."""
    return re.search(r"\(ran in (float16|bfloat16)", str(event)) is not None


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
        _hook_exit()
        from .._framework import REGISTRY

        for name in REGISTRY:  # a framework's name is its top-level module
            _when_imported(name, lambda _module, _name=name: _install_framework(_name))
        _when_imported("ppdet", _register_det)
        if options.emulate_fp16:  # trainers that choose AMP by device type (ampsafe.run.integrations)
            from .integrations import targets as integration_targets

            for name, target in integration_targets():
                _when_imported(target, lambda module, _name=name: _integrate(_name, module))
        _when_imported("ppocr.modeling.necks", _register_ocr)
        return options


def uninstall() -> None:
    """Undo everything the run put in place (every patch and hook in its ledger, the emulators it installed) and
    drop pending hooks (registered necks stay registered)."""
    with _lock:
        _state["patches"].restore()
        _hook.pending.clear()
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        for ctx in _state["watches"]:
            ctx.__exit__(None, None, None)
        _state["watches"].clear()
        for guard in _state["guards"]:
            guard.enabled = False  # an optimizer method wrapped by another guard passes straight through
        _state["options"] = None


def installed() -> bool:
    return _state["options"] is not None


def _disabled_reason(scaler) -> str | None:
    """Why the scaler does nothing (the scaler's own ``disabled_reason``), or None when it scales or guards."""
    reason = getattr(scaler, "disabled_reason", None)
    if reason is None and not scaler._run_guards():
        reason = "disabled (the scaler reports itself disabled)"
    return reason


def _hf_follow(scaler):
    from .hf import follow

    return follow(scaler)


def _hf_keep_in_fp32(scaler):
    from .hf import keep_in_fp32

    try:
        return keep_in_fp32(scaler)
    except Exception:  # noqa: BLE001 - an extra line of the report never costs the summary
        return None


def summary() -> dict:
    """What ampsafe changed, and per scaler created: its class, framework, the script's own arguments and stats."""
    rows = []
    for entry in _state["scalers"]:
        scaler = entry["scaler"]
        stats = scaler.stats.to_dict() if hasattr(scaler.stats, "to_dict") else dict(vars(scaler.stats))
        scale = scaler._run_scale()
        heal_records = [
            {"step": h.get("step"), "paths": list(h.get("paths", ()))} if isinstance(h, dict) else h
            for h in stats.get("heals", [])
        ]
        stats["heals"] = len(heal_records)
        stats["scale_history"] = list(stats.get("scale_history", []))[-5:]
        prefix, backoff_scan = entry.get("holder_path") or "", entry.get("backoff_scan")
        if prefix:  # paths relative to the object the user holds (ampsafe.run.holder)
            from .holder import prefixed

            for h in heal_records:
                if isinstance(h, dict):
                    h["paths"] = prefixed(prefix, h["paths"])
            if backoff_scan:
                backoff_scan = {
                    k: prefixed(prefix, v) if k in ("paths", "modules") else v for k, v in backoff_scan.items()
                }
        base = next(c for c in type(scaler).__mro__ if c.__module__ != SHIM_MODULE)  # ampsafe's class, not the shim
        model = getattr(scaler, "model", None) or getattr(scaler, "_model", None)
        rows.append(
            {
                "class": f"{base.__module__}.{base.__name__}",
                "framework": entry["framework"],
                "script_kwargs": {k: repr(v) for k, v in entry["kwargs"].items()},
                "scale": scale,
                "disabled_reason": _disabled_reason(scaler),
                "model": entry.get("holder") or (type(model).__name__ if model is not None else None),
                "model_path": prefix or None,
                "heal_records": heal_records,
                "hf_keep_in_fp32": _hf_keep_in_fp32(scaler),  # HF's _keep_in_fp32_modules for the heals (run/hf.py)
                "steps": list(entry["steps"]),
                "watch_backoffs": list(entry.get("watch_backoffs") or [])[-100:],
                "backoff_scan": backoff_scan,
                "island_levels": _island_levels(entry["framework"]),
                "reloads": list(entry.get("reloads") or []),
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
        "ended": _state.get("ended"),
    }


def _note_exception(exc_type, exc, tb) -> None:
    """``sys.excepthook``: the error that ended the run, quoted in the summary and the report."""
    if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
        first = (str(exc).splitlines() or [""])[0]
        _state["ended"] = {"exception": f"{exc_type.__name__}: {first}"[:500]}
    _state["excepthook"](exc_type, exc, tb)


def _note_exit(code=None):
    """``sys.exit``: the script's own exit status and where it asked for it (torchvision's engine exits 1 on a
    non-finite loss before any optimizer step)."""
    frame = sys._getframe(1)
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    _state["ended"] = {"exit": code if code is None or isinstance(code, int) else str(code)[:500], "where": where}
    _state["sys_exit"](code)


def _hook_exit() -> None:
    _state["ended"] = None
    _state["excepthook"], _state["sys_exit"] = sys.excepthook, sys.exit
    _set_attr(sys, "excepthook", _note_exception)
    _set_attr(sys, "exit", _note_exit)


def _explain_exit() -> None:
    """The script stopped with a forward no optimizer step followed: replay it once in float32 (FP32 guard)."""
    if any(g.exit_origin for g in _state["guards"]):
        return
    for guard in _state["guards"]:
        if guard.explain_exit() is not None:
            return


def _write_report() -> None:
    directory = os.environ.get(ENV_REPORT)
    if not directory or _state["options"] is None:
        return
    _explain_exit()
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
