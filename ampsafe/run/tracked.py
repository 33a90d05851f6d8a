"""One scaler the run built, while it trains: its per-step records and reactions, and its summary row.

Why one class: the run reacts to each scaler step in several ways (the report's plot record, the holder the
report's paths are relative to, the scan of a batch after many backoffs, HF's ``_keep_in_fp32_modules``
measurement, the headroom sampler, ``--watch``). They all hear the step through ONE :meth:`TrackedScaler.on_step`, registered once
with ``scaler.add_step_callback``, and keep their state in fields declared here. :meth:`TrackedScaler.record`
turns it into the summary's :class:`~ampsafe.run.records.ScalerRecord`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..core.capture import example_inputs
from ..core.model import unwrap
from ..core.modpath import outermost
from ..hosts.hf import hf_lines, is_hf_model
from ..policies.island import island_modules
from .records import (
    BackoffScan,
    BadInputStep,
    BelowFloorStep,
    Heal,
    OverflowOrigin,
    Refusal,
    Reload,
    ScalerRecord,
)
from .scaler_class import SHIM_MODULE

__all__ = ["TrackedScaler", "backoff_scan", "disabled_reason", "STEP_RECORDS", "BACKOFF_SCAN_AT"]

STEP_RECORDS = 100_000  # per scaler: the (step, scale, overflow, floor hit) records kept for the report's plot
BACKOFF_SCAN_AT = 3  # overflowing steps above the floor before the report's scan looks at the batch


def disabled_reason(scaler) -> str | None:
    """Why the scaler does nothing (the scaler's own ``disabled_reason``), or None when it scales or guards."""
    reason = getattr(scaler, "disabled_reason", None)
    if reason is None and not scaler._run_guards():
        reason = "disabled (the scaler reports itself disabled)"
    return reason


def backoff_scan(scaler, step: int) -> BackoffScan:
    """``ampsafe.scan`` of the step's batch (the scaler's capture, still held during ``update()``): the paths near
    float16's edge and the modules policy "island" would island for them (a container only when its own forward
    needs float32), or why the scan could not run. A failure is reported; training goes on."""
    model, capture = getattr(scaler, "model", None), getattr(scaler, "capture", None)
    latest = capture.latest if capture is not None else None
    if model is None or latest is None:
        return BackoffScan(step=step, error="no captured batch to scan")
    try:
        import ampsafe

        inputs = example_inputs(model, latest)  # HF models are called with keywords: model(**batch)
        with capture.paused():
            report = ampsafe.scan(model, inputs)
    except Exception as exc:  # the scan is advice for the report
        return BackoffScan(step=step, error=f"{type(exc).__name__}: {exc}"[:300])
    risky = [p for p in report.paths if p.risky and not p.protected]
    backend = scaler._backend() if hasattr(scaler, "_backend") else None
    modules = tuple(outermost([m for p in risky for m in island_modules(p, report.level, backend) if m]))
    scan = BackoffScan(step=step, paths=tuple(p.start for p in risky), modules=modules)
    if not modules or backend is None or not is_hf_model(unwrap(model)):
        return scan
    try:
        with capture.paused():
            lines = hf_lines(backend, model, inputs, capture.state, modules, scan.paths, step)
    except Exception as exc:  # noqa: BLE001 - the trials are advice for the report; training goes on
        return dataclasses.replace(scan, island_trial=f"the trial could not run ({type(exc).__name__}: {exc})"[:300])
    return dataclasses.replace(
        scan,
        island_trial=lines.island,
        island_works=lines.island_works,
        hf_keep=lines.keep,
        hf_keep_note=lines.keep_note,
    )


def _island_levels(framework: str) -> dict:
    """level -> (where, advice) of the framework's levels whose island line differs (``Amp.island_levels``)."""
    from .._framework import backend_named

    return {level: tuple(words) for level, words in backend_named(framework).amp.island_levels.items()}


class TrackedScaler:
    """A scaler the run built (``framework``'s, with the script's own ``kwargs``) and what the run saw of it.

    ``steps``: ``(step, scale, overflow, floor hit)`` per step (the plot); ``reloads``: checkpoint reloads;
    ``holder`` / ``holder_path``: the object the user holds around the scaler's model and the model's path in it
    (:mod:`ampsafe.run.holder`, found at the first step while the model is alive); ``scan``: the backoff scan,
    once; ``watch``: the ``--watch`` sentinel (:class:`~ampsafe.run.watch.ScalerWatch`), or None; ``board``: the
    ``--tensorboard`` folder its ``amp/*`` metrics go to, or None.
    """

    def __init__(self, scaler, framework: str, kwargs: dict) -> None:
        from ..hosts.hf import follow

        self.scaler = scaler
        self.framework = framework
        self.kwargs = dict(kwargs)
        self.steps: list[tuple[int, float, bool, bool]] = []
        self.reloads: list[Reload] = []
        self.holder_known = False
        self.holder: str | None = None
        self.holder_path = ""
        self.backoffs = 0  # overflowing steps above the floor, up to the scan
        self.scan: BackoffScan | None = None
        self.watch: Any = None
        self.headroom: Any = None  # the headroom sampler (ampsafe.run.headroom), or None
        self.bad_inputs: list[BadInputStep] = []  # steps skipped for a non-finite model input (data)
        self.origins: list[OverflowOrigin] = []  # overflowing steps' backward evidence
        self.board: str | None = None  # --tensorboard: the folder of its event file (ampsafe.run.loggers)
        self.static: Any = None  # built with a fixed scale of 1 (ampsafe.run.static_scale), or None
        self._hf_follow: Callable = follow(scaler)

    def on_step(self, decision) -> None:
        """Every reaction of the run to one scaler step (``scaler.add_step_callback``), in order: the plot record
        (and the holder, at the first step), the backoff scan, HF's measurement, ``--watch`` (which may raise)."""
        if not self.holder_known:  # the first step: the scaler has resolved its model, still alive now
            self._note_holder()
        bad = getattr(decision, "bad_input", None)  # data, not an overflow: no backoff, no scan (core.scale)
        overflow = bool(decision.found_inf) and bad is None
        if len(self.steps) < STEP_RECORDS:
            self.steps.append((decision.step, float(decision.scale), overflow, decision.floor_hit))
        origin = getattr(decision, "grad_origin", None)
        if origin is not None and len(self.origins) < STEP_RECORDS:
            self.origins.append(OverflowOrigin(decision.step, origin.module, origin.kind))
        if bad is not None and len(self.bad_inputs) < STEP_RECORDS:
            self.bad_inputs.append(BadInputStep(decision.step, bad.where, bad.sample, float(decision.scale)))
        if overflow and not decision.floor_hit and self.scan is None:
            self.backoffs += 1
            if self.backoffs >= BACKOFF_SCAN_AT:
                self.scan = backoff_scan(self.scaler, decision.step)
        self._hf_follow(decision)
        if self.headroom is not None:
            try:
                self.headroom.on_step(self.scaler, decision)
            except Exception as exc:  # noqa: BLE001 - a sample is advice: training goes on without it
                self.headroom.stop(f"sampling stopped at step {decision.step}: {type(exc).__name__}: {exc}"[:300])
        if self.static is not None:
            self.static.on_step(self.scaler, decision, getattr(self.headroom, "underflow", None))
        if self.watch is not None:
            self.watch.on_step(decision)

    def reloaded(self, before: float | None) -> Reload:
        """The scaler's state was loaded from a checkpoint: an event of the run (the report lists it)."""
        event = Reload(
            after_step=self.steps[-1][0] if self.steps else None,
            scale_before=before,
            scale_after=self.scaler._run_scale(),
        )
        self.reloads.append(event)
        return event

    def _note_holder(self) -> None:
        self.holder_known = True
        model = getattr(self.scaler, "model", None)
        if model is None or not hasattr(self.scaler, "_backend"):
            return
        from .holder import holder_of

        holder, self.holder_path = holder_of(self.scaler._backend(), model)
        self.holder = type(holder).__name__ if holder is not None else None

    def _heals(self, heals) -> tuple[Heal, ...]:
        from .holder import prefixed

        out = []
        for h in heals:  # HealRecords (ampsafe.core.scale), as every healing scaler keeps them
            cause = {
                "forward": "forward",
                "scanned": "forward",
                "backward": "backward",
                "generation": "generation overflow",
            }.get(h.verdict.where if h.verdict is not None else "", "")
            paths = tuple(prefixed(self.holder_path, h.paths))
            widened = tuple(prefixed(self.holder_path, getattr(h, "widened", ())))
            out.append(Heal(step=h.step, paths=paths, scale_after=h.scale_after, cause=cause, widened=widened))
        return tuple(out)

    def _scan(self) -> BackoffScan | None:
        """The backoff scan with its paths relative to the holder."""
        from .holder import prefixed

        if self.scan is None or not self.holder_path:
            return self.scan
        return dataclasses.replace(
            self.scan,
            paths=tuple(prefixed(self.holder_path, self.scan.paths)),
            modules=tuple(prefixed(self.holder_path, self.scan.modules)),
        )

    def record(self) -> ScalerRecord:
        """The summary's row: class, framework, the script's own arguments, stats and what the run saw."""
        scaler = self.scaler
        stats = scaler.stats
        base = next(c for c in type(scaler).__mro__ if c.__module__ != SHIM_MODULE)  # ampsafe's class, not the shim
        model = getattr(scaler, "model", None) or getattr(scaler, "_model", None)
        heals = self._heals(stats.heals)
        return ScalerRecord(
            class_name=f"{base.__module__}.{base.__name__}",
            framework=self.framework,
            script_kwargs={k: repr(v) for k, v in self.kwargs.items()},
            scale=scaler._run_scale(),
            disabled_reason=disabled_reason(scaler),
            model=self.holder or (type(model).__name__ if model is not None else None),
            model_path=self.holder_path or None,
            heal_records=heals,
            hf_keep_in_fp32=_hf_keep_in_fp32(scaler),  # HF's _keep_in_fp32_modules for the heals (run/hf.py)
            steps=tuple(self.steps),
            watch_backoffs=tuple(self.watch.backoffs[-100:]) if self.watch is not None else (),
            backoff_scan=self._scan(),
            island_levels=_island_levels(self.framework),
            engine_fixes=_engine_fixes(scaler, stats.heals),
            reloads=tuple(self.reloads),
            total_steps=stats.total_steps,
            skipped_steps=stats.skipped_steps,
            overflow_steps=stats.overflow_steps,
            floor_hits=stats.floor_hits,
            scale_history=tuple(stats.scale_history)[-5:],
            heals=len(heals),
            input_steps=getattr(stats, "input_steps", 0),
            bad_inputs=tuple(self.bad_inputs[-100:]),
            headroom=self.headroom.record() if self.headroom is not None else None,
            on_floor=_on_floor(scaler),
            overflow_origins=tuple(self.origins),
            below_floor=tuple(BelowFloorStep(**b.to_dict()) for b in getattr(stats, "below_floor", ())),
            refusals=tuple(Refusal(step, why[:2000]) for step, why in getattr(stats, "refusals", ())),
            underflow=self._underflow(),
            static_scale=self.static.record() if self.static is not None else None,
        )

    def _underflow(self):
        """The sampler's underflow series, its module paths relative to the holder (None: not sampled)."""
        series = getattr(self.headroom, "underflow", None)
        if series is None:
            return None
        from .holder import prefixed

        record = series.record()
        if not self.holder_path or not record.modules:
            return record
        names = prefixed(self.holder_path, list(record.modules))
        return dataclasses.replace(record, modules=dict(zip(names, record.modules.values())))


def _on_floor(scaler) -> str:
    policy = getattr(scaler, "policy", None)
    return policy.on_floor.value if policy is not None else ""


def _engine_fixes(scaler, heals) -> dict:
    """The fix lines of the engine that owns the scale (a DeepSpeed engine's ``fix_lines(paths)``: key -> (line,
    advice)), for the healed paths as the scaler's model names them; empty for a plain scaler."""
    lines = getattr(scaler, "fix_lines", None)
    paths = [p for h in heals for p in h.paths]
    return dict(lines(list(dict.fromkeys(paths)))) if callable(lines) and paths else {}


def _hf_keep_in_fp32(scaler) -> tuple[str, ...] | None:
    from ..hosts.hf import keep_in_fp32

    try:
        names = keep_in_fp32(scaler)
    except Exception:  # noqa: BLE001 - an extra line of the report never costs the summary
        return None
    return tuple(names) if names is not None else None
