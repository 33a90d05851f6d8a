"""What ``ampsafe run``'s child hands its parent, and what the report reads: frozen records, each with
``to_dict`` / ``from_dict`` (JSON), as :class:`~ampsafe.run.options.RunOptions` has.

Why: the child writes its summary as JSON at exit (``<pid>.json``), the parent reads it back, and the report words
it. One record per kind of fact, every field declared with its default, means a key is spelled once, a summary
from an older or partial source still reads (a missing key is its default), and the report reads attributes.

    summary = RunSummary.from_dict(json.load(fh))     # the parent
    summary.scalers[0].skipped_at                     # the report
    fix = permanent_fix(summary); fix.to_dict()       # report.json's "fix"

Pure Python: imports no framework.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .options import RunOptions

__all__ = [
    "Heal",
    "BackoffScan",
    "WatchBackoff",
    "BadInputStep",
    "Reload",
    "HeadroomAlert",
    "Headroom",
    "UnderflowRecord",
    "StaticScale",
    "AddScaler",
    "NoScaler",
    "ScalerRecord",
    "Origin",
    "GuardRecord",
    "TargetRecord",
    "Ended",
    "RunSummary",
    "SwapNeck",
    "PermanentFix",
]


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: records as dicts, tuples as lists."""
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Record:
    """``to_dict`` / ``from_dict`` by the dataclass fields. ``_KEYS``: field -> its JSON key where they differ;
    ``_ONE`` / ``_MANY``: field -> the record type of one nested value / of each item of a sequence."""

    _KEYS: ClassVar[Mapping[str, str]] = {}
    _ONE: ClassVar[Mapping[str, type]] = {}
    _MANY: ClassVar[Mapping[str, type]] = {}

    def to_dict(self) -> dict[str, Any]:
        return {self._KEYS.get(f.name, f.name): _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None):
        """The record a :meth:`to_dict` (or its JSON) holds; a missing key is the field's default, an unknown
        one is ignored (a later summary may carry more)."""
        data = data or {}
        values = {}
        for f in fields(cls):
            key = cls._KEYS.get(f.name, f.name)
            if key not in data:
                continue
            value = data[key]
            if f.name in cls._ONE and value is not None and not isinstance(value, _Record):
                value = cls._ONE[f.name].from_dict(value)
            elif f.name in cls._MANY:
                kind = cls._MANY[f.name]
                value = tuple(v if isinstance(v, _Record) else kind.from_dict(v) for v in value or ())
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            values[f.name] = value
        return cls(**values)


# --------------------------------------------------------------------------------------------- one scaler


@dataclass(frozen=True)
class Heal(_Record):
    """One heal as the summary keeps it: the step, the module paths it islanded (relative to the holder) and the
    loss scale the heal restarted the scaler from."""

    step: int | None = None
    paths: tuple[str, ...] = ()
    scale_after: float | None = None
    cause: str = ""  # the pass that overflowed, as the heal measured it ("forward", "backward", "generation overflow"; "" unknown)
    widened: tuple[str, ...] = ()  # the engine units among ``paths`` given float32 compute instead of an island


@dataclass(frozen=True)
class OverflowOrigin(_Record):
    """An overflowing step's backward evidence: the module whose gradient first went non-finite and whether it
    was its parameters' gradients or the gradient it passed back (``kind``: "parameter" / "activation")."""

    step: int | None = None
    module: str = ""
    kind: str = ""


@dataclass(frozen=True)
class BelowFloorStep(_Record):
    """The scale moved below the floor at ``step`` (``floor`` -> ``scale``), and why; ``lost``: the fraction of
    the gradient that flushes to zero at the new scale, when measured."""

    step: int | None = None
    floor: float | None = None
    scale: float | None = None
    module: str | None = None
    reason: str = ""
    lost: float | None = None


@dataclass(frozen=True)
class Refusal(_Record):
    """A heal at the floor that healed nothing: the step and the measured reason the scaler raised."""

    step: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class BackoffScan(_Record):
    """``ampsafe.scan`` on the batch of the ``BACKOFF_SCAN_AT``-th backoff above the floor: the risky paths, the
    modules an island of them patches, or why the scan could not run. For an HF model the lines were tried on it
    (:mod:`ampsafe.run.hf_lines`): ``island_trial`` / ``island_works``, and ``hf_keep`` (HF's
    ``_keep_in_fp32_modules`` line, only when its trial removed the overflow) with ``hf_keep_note`` (the trial's
    evidence, or why there is no line)."""

    step: int | None = None
    paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    error: str | None = None
    island_trial: str = ""
    island_works: bool | None = None
    hf_keep: str | None = None
    hf_keep_note: str = ""


@dataclass(frozen=True)
class WatchBackoff(_Record):
    """``--watch``: one routine backward overflow the scaler absorbed (counted, not raised)."""

    step: int | None = None
    scale: float | None = None
    where: str = ""


@dataclass(frozen=True)
class BadInputStep(_Record):
    """A step the scaler skipped for its data: a non-finite model input (``where``, ``sample``), the scale kept."""

    step: int | None = None
    where: str = ""
    sample: int | None = None
    scale: float | None = None


@dataclass(frozen=True)
class Reload(_Record):
    """The script loaded its scaler's state (a checkpoint reload) mid-run."""

    after_step: int | None = None
    scale_before: float | None = None
    scale_after: float | None = None


@dataclass(frozen=True)
class HeadroomAlert(_Record):
    """The early warning (:mod:`ampsafe.run.headroom`): ``module``'s float16 headroom falls by ``bits_per_100``
    bits per 100 steps; at step ``step`` it had ``headroom_bits`` left, and at that rate it passes 65504 near step
    ``crossing_step``; ``also``: the next modules projected to cross soon. ``message``: the line printed."""

    module: str = ""
    step: int | None = None
    headroom_bits: float | None = None
    bits_per_100: float | None = None
    crossing_step: int | None = None
    also: tuple[str, ...] = ()  # other modules projected to cross within the horizon, nearest first
    message: str = ""


@dataclass(frozen=True)
class Headroom(_Record):
    """What the headroom sampler saw: every ``every``-th step (and every step of the first ones, and while a
    crossing is near) the float32 abs-max of each tracked module's output in the step's own forward, and the
    unscaled gradient norm. ``series``: module -> ``(step, amax)`` pairs for the modules with the least headroom
    (amax None: non-finite); ``grad_norm``: ``(step, norm)`` pairs; ``paths``: how the tracked modules were found
    (``"scan"``, or the conv/linear layers where a scan would be an extra forward); ``note``: why nothing was
    sampled, if so; ``alert``: the early warning, if it fired."""

    _ONE: ClassVar[Mapping[str, type]] = {"alert": HeadroomAlert}

    every: int = 0
    paths: str = ""
    tracked: int = 0
    samples: int = 0
    series: Mapping[str, tuple] = field(default_factory=dict)
    grad_norm: tuple[tuple, ...] = ()
    alert: HeadroomAlert | None = None
    note: str | None = None

    @classmethod
    def from_dict(cls, data):
        record = super().from_dict(data)
        series = {k: tuple(tuple(p) for p in v) for k, v in (record.series or {}).items()}
        return dataclasses.replace(record, series=series)


@dataclass(frozen=True)
class UnderflowRecord(_Record):
    """Gradient underflow in float16 on the sampled steps (:mod:`ampsafe.core.underflow` says what is counted):
    ``series``: ``(step, scale, zero, subnormal)`` per sample, the fractions of the gradient elements that float16
    holds as zero / as subnormal at the step's loss scale; ``elements``: elements counted at the latest sample;
    ``modules``: module path -> (zero, subnormal) at the latest sample, the worst few; ``lost_below``: ``(scale,
    fraction)``: of the elements non-zero at the latest sample, the fraction a lower scale would flush to zero
    (a lower bound); ``note``: why sampling stopped, if it did."""

    every: int = 0
    samples: int = 0
    series: tuple[tuple, ...] = ()
    elements: int = 0
    modules: Mapping[str, tuple] = field(default_factory=dict)
    lost_below: tuple[tuple, ...] = ()
    note: str | None = None

    @classmethod
    def from_dict(cls, data):
        record = super().from_dict(data)
        return dataclasses.replace(record, modules={k: tuple(v) for k, v in (record.modules or {}).items()})

    @property
    def latest(self) -> tuple | None:
        """The latest ``(step, scale, zero, subnormal)``, or None."""
        return self.series[-1] if self.series else None


@dataclass(frozen=True)
class StaticScale(_Record):
    """A scaler built with a fixed loss scale of 1 (``use_dynamic_loss_scaling=False``, ``init_loss_scaling=1``:
    PaddleOCR's ``Global.use_amp: True`` alone): skipped steps still skip, but the scale never moves, so nothing
    lifts the gradients float16 flushes. Read from the scaler the script built, never from a config file.

    ``level``: the AMP level of its first step's forward ("O2", "" unknown); ``scale``: the fixed scale;
    ``dynamic``: always False here (the field says what was seen); ``words``: the one phrase the banner and the
    report use (``"O2, static loss scale 1, no dynamic scaling"``); ``kwargs``: the script's arguments to the
    scaler; ``step``, ``zero``, ``subnormal``, ``elements``: the first sampled step whose gradients were
    finite, its fractions of gradient elements zero / subnormal in float16 (:mod:`ampsafe.core.underflow`);
    ``chosen_scale``: the dynamic start ampsafe chose from that measurement
    (:func:`~ampsafe.core.underflow.lift_scale`) and ``subnormal_at_chosen`` its projected subnormal fraction of
    the non-zero elements; ``trainer``, ``config`` (key -> value) and ``overrides`` (the command-line form, and
    ``overrides_note``: where it goes): the trainer's own fix (PaddleOCR's ``Global`` keys); ``code``: the framework's line; ``note``: why nothing was
    measured, if so."""

    level: str = ""
    scale: float | None = None
    dynamic: bool = False
    words: str = ""
    kwargs: Mapping[str, str] = field(default_factory=dict)
    step: int | None = None
    zero: float | None = None
    subnormal: float | None = None
    elements: int = 0
    chosen_scale: float | None = None
    subnormal_at_chosen: float | None = None
    trainer: str = ""
    config: Mapping[str, str] = field(default_factory=dict)
    overrides: str = ""
    overrides_note: str = ""
    code: str = ""
    note: str = ""


@dataclass(frozen=True)
class ScalerRecord(_Record):
    """One scaler the run built: the summary's row. ``steps``: ``(step, scale, overflow, floor hit)`` per step
    (the plot); ``island_levels``: level -> (where, advice) of the framework's levels whose island line differs;
    the counters are the scaler's ``stats``."""

    _KEYS: ClassVar[Mapping[str, str]] = {"class_name": "class"}
    _ONE: ClassVar[Mapping[str, type]] = {
        "backoff_scan": BackoffScan,
        "headroom": Headroom,
        "underflow": UnderflowRecord,
        "static_scale": StaticScale,
    }
    _MANY: ClassVar[Mapping[str, type]] = {
        "heal_records": Heal,
        "watch_backoffs": WatchBackoff,
        "reloads": Reload,
        "bad_inputs": BadInputStep,
        "overflow_origins": OverflowOrigin,
        "below_floor": BelowFloorStep,
        "refusals": Refusal,
    }

    class_name: str = ""
    framework: str = ""
    script_kwargs: Mapping[str, str] = field(default_factory=dict)
    scale: float | None = None
    disabled_reason: str | None = None
    model: str | None = None
    model_path: str | None = None
    heal_records: tuple[Heal, ...] = ()
    hf_keep_in_fp32: tuple[str, ...] | None = None
    steps: tuple[tuple, ...] = ()
    watch_backoffs: tuple[WatchBackoff, ...] = ()
    backoff_scan: BackoffScan | None = None
    island_levels: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    engine_fixes: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # key -> (line, advice), ``fix_lines``
    reloads: tuple[Reload, ...] = ()
    total_steps: int = 0
    skipped_steps: int = 0
    overflow_steps: int = 0
    floor_hits: int = 0
    scale_history: tuple[float, ...] = ()
    heals: int = 0
    input_steps: int = 0  # skipped for a non-finite model input (data): not overflows, the scale kept
    bad_inputs: tuple[BadInputStep, ...] = ()
    headroom: Headroom | None = None  # the headroom sampler's series and early warning (None: not sampled)
    on_floor: str = ""  # the scaler's on_floor ("heal", "raise", "clamp")
    overflow_origins: tuple[OverflowOrigin, ...] = ()  # per overflowing step: where its backward went non-finite
    below_floor: tuple[BelowFloorStep, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    underflow: UnderflowRecord | None = None  # gradient underflow on the sampled steps, before the unscale
    static_scale: StaticScale | None = None  # built with a fixed loss scale of 1 (the scale never moves)

    @property
    def overflowed(self) -> bool:
        """Whether float16 overflowed under this scaler (a data step is not an overflow)."""
        return not self.disabled_reason and bool(self.overflow_steps or self.floor_hits or self.heals)

    @property
    def skipped_at(self) -> list[int]:
        """The steps that overflowed (skipped), from the per-step records (data steps are not among them)."""
        return [r[0] for r in self.steps if r[2]]

    @property
    def first_scale(self) -> float | None:
        return self.steps[0][1] if self.steps else None


# --------------------------------------------------------------------------------------------- guards, targets


@dataclass(frozen=True)
class Origin(_Record):
    """Where a replay or the sentinel found the first non-finite value: op, module, pass, sample, kind."""

    step: int | None = None
    phase: str = ""
    module: str | None = None
    op: str = ""
    kind: str = ""
    sample: int | None = None
    where: str = ""
    how: str = ""
    message: str = ""


@dataclass(frozen=True)
class AddScaler(_Record):
    """The lines that add a loss scaler to a float16 loop without one, in the framework's own words: ``create``
    after the optimizer is built, ``backward`` in place of ``replaces_backward``, ``step`` then ``update`` in place
    of ``replaces_step``; ``note``: what else the change needs (float16 parameters), or ""."""

    framework: str = ""
    create: str = ""
    backward: str = ""
    step: str = ""
    update: str = ""
    replaces_backward: str = "loss.backward()"
    replaces_step: str = "optimizer.step()"
    note: str = ""


@dataclass(frozen=True)
class NoScaler(_Record):
    """A float16 backward with no loss scaler, as the FP32 guard saw it: first at ``step``, ``why`` it is float16
    (``"float16 autocast"`` on the step's forward, ``"float16 parameters"`` in the optimizer), the line printed,
    the steps since with a non-finite loss or gradient (skipped by the guard; nothing else would have), the
    underflow at scale 1 on the sampled steps, and the lines that add a scaler."""

    _ONE: ClassVar[Mapping[str, type]] = {"underflow": UnderflowRecord, "lines": AddScaler}

    step: int | None = None
    why: str = ""
    message: str = ""
    steps: int = 0
    nonfinite_steps: tuple[int, ...] = ()
    underflow: UnderflowRecord | None = None
    lines: AddScaler | None = None


@dataclass(frozen=True)
class GuardRecord(_Record):
    """One framework's FP32 guard (:class:`~ampsafe.run.guard.StepGuard`): the optimizer steps it saw and skipped;
    ``no_scaler``: its steps were a float16 backward with no loss scaler (None: they were not)."""

    _ONE: ClassVar[Mapping[str, type]] = {"exit_origin": Origin, "no_scaler": NoScaler}

    framework: str = ""
    model: str | None = None
    total_steps: int = 0
    skipped_steps: int = 0
    skipped_at: tuple[int, ...] = ()
    offenders: tuple[str, ...] = ()
    scaler_steps: int = 0
    unchecked_steps: int = 0
    max_skips: int = 0
    restored: tuple[str, ...] = ()
    exit_origin: Origin | None = None
    no_scaler: NoScaler | None = None


@dataclass(frozen=True)
class TargetRecord(_Record):
    """One checked detection entry point (:class:`~ampsafe.run.target_hooks.TargetHook`)."""

    where: str = ""
    policy: str = ""
    calls: int = 0
    bad_boxes: int = 0
    first: str | None = None


@dataclass(frozen=True)
class Ended(_Record):
    """What ended the run early: an uncaught error (``exception``) or the script's own ``sys.exit`` (``exit`` and
    ``where`` it was called)."""

    exception: str | None = None
    exit: int | str | None = None
    where: str | None = None


@dataclass(frozen=True)
class RunSummary(_Record):
    """One process of the run: what ampsafe changed, its scalers, guards, target checks and how it ended."""

    _ONE: ClassVar[Mapping[str, type]] = {"ended": Ended}
    _MANY: ClassVar[Mapping[str, type]] = {"scalers": ScalerRecord, "guards": GuardRecord, "targets": TargetRecord}

    pid: int | None = None
    options: RunOptions | None = None
    changes: tuple[str, ...] = ()
    scalers: tuple[ScalerRecord, ...] = ()
    guards: tuple[GuardRecord, ...] = ()
    targets: tuple[TargetRecord, ...] = ()
    ended: Ended | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["options"] = self.options.to_dict() if self.options is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunSummary:
        data = dict(data or {})
        options = data.pop("options", None)
        summary = super().from_dict(data)
        if isinstance(options, Mapping):
            options = RunOptions.from_mapping(options, where="the run summary's options")
        return dataclasses.replace(summary, options=options)

    @property
    def watch(self) -> bool:
        return bool(self.options is not None and self.options.watch)


# --------------------------------------------------------------------------------------------- the fix


@dataclass(frozen=True)
class SwapNeck(_Record):
    """The ``ampsafe swap-neck`` command for the ``-c`` config (``applicable``), or why there is none."""

    applicable: bool = False
    reason: str | None = None
    command: str | None = None
    config: str | None = None
    run: str | None = None


@dataclass(frozen=True)
class PermanentFix(_Record):
    """What to change so that the next run needs no healing (``report.json``'s ``fix``).

    ``patch``: the healed modules as one island line; ``level_lines``: ``<framework>_<level>`` (``paddle_o2``) ->
    the island line for a level whose line differs, with its advice in ``level_islands`` (in JSON each line sits
    under its own key beside ``patch``); ``hf_keep_in_fp32``: HF's ``_keep_in_fp32_modules`` line; ``advice``: one
    sentence per other problem; ``problems``: everything that went wrong (:func:`ampsafe.run.report.problems`)."""

    _ONE: ClassVar[Mapping[str, type]] = {"swap_neck": SwapNeck}

    patch: str | None = None
    level_islands: Mapping[str, str] = field(default_factory=dict)
    swap_neck: SwapNeck | None = None
    advice: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    hf_keep_in_fp32: str | None = None
    level_lines: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        lines = data.pop("level_lines")
        return {**data, **lines}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PermanentFix:
        data = dict(data or {})
        lines = {key: data.pop(key) for key in data.get("level_islands") or {} if key in data}
        return dataclasses.replace(super().from_dict(data), level_lines=lines)
