"""``ampsafe run --report DIR``: what happened in a run, and what to change so that the next run needs no healing.

Per Python process of the command that trained something, ``DIR`` gets (in ``DIR/<pid>/`` when several did):

* ``report.md``: the scalers (steps, overflows, skips, floor hits, heals, or why one was disabled), the FP32
  guard's skipped steps, the bad detection targets, and **the permanent fix**: the healed module paths as a
  ready ``ampsafe.patch(model, policy="island", paths=[...])`` line (for Paddle O2 the ``excluded_layers`` of
  ``paddle.amp.decorate`` too), and the ``ampsafe swap-neck`` command when float16 overflowed and the ``-c``
  config's neck has an AMP-safe counterpart (never for a clean run, an FP32 run or bad data);
* ``report.json``: the same as data (the process's summary plus ``fix``, a :class:`~ampsafe.run.records.PermanentFix`);
* ``scale.png``: the loss scale per step, the overflowing / skipped steps and the heals (matplotlib, Agg).
* ``headroom.png``: each tracked module's sampled float16 headroom beside the loss scale, and the early warning
  (:mod:`ampsafe.run.report_headroom`).

Framework-neutral: it reads the summaries ``ampsafe.auto`` writes (JSON), imports no framework, and imports
matplotlib only to draw.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from .records import (
    BackoffScan,
    Ended,
    GuardRecord,
    Origin,
    PermanentFix,
    RunSummary,
    ScalerRecord,
    SwapNeck,
)

__all__ = ["write_reports", "permanent_fix", "to_markdown", "format_summary", "problems"]


Summary = Union[RunSummary, Mapping[str, Any]]  # a summary record, or its JSON as read back


def _record(report: Summary) -> RunSummary:
    return report if isinstance(report, RunSummary) else RunSummary.from_dict(report)


def _active(report: RunSummary) -> bool:
    return bool(
        report.scalers
        or any(g.total_steps for g in report.guards)
        or any(t.calls for t in report.targets)
        or any(g.exit_origin for g in report.guards)
        or report.ended
    )


def _healed_paths(report: RunSummary) -> dict[str, list[str]]:
    """framework -> the module paths healed into FP32 islands (in heal order, each once): the heal records the
    scalers kept, which are the modules each heal's log line named. An engine unit the heal widened is not an
    island (an island of it would not hold the value it hands on): the engine's own lines fix it."""
    out: dict[str, list[str]] = {}
    for s in report.scalers:
        for h in s.heal_records:
            paths = out.setdefault(s.framework, [])
            paths += [p for p in h.paths if p not in paths and p not in h.widened]
    return out


def _level_islands(report: RunSummary, healed: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """``<framework>_<level>`` -> (island line, advice) for each level whose island line differs from the default
    (the framework's ``Amp.island_levels``, recorded on its scalers), for the frameworks that healed."""
    out: dict[str, tuple[str, str]] = {}
    for s in report.scalers:
        for level, (_, advice) in s.island_levels.items():
            if healed.get(s.framework):
                out[f"{s.framework}_{level.lower()}"] = (_island_line(healed[s.framework], level), advice)
        out.update({key: tuple(words) for key, words in s.engine_fixes.items()})  # a DeepSpeed engine's own lines
    return out


def _cut(items, n: int) -> str:
    """The first ``n`` items, then "…" when there are more."""
    items = list(items)
    return ", ".join(map(str, items[:n])) + (", …" if len(items) > n else "")


def _scaler_counts(s: ScalerRecord, n: int) -> str:
    """``6 steps, 6 skipped, 3 floor hits, 0 heals, final scale 1.0; 6 overflowing (steps 0, 1, …)``: the
    summary's and the report's words for one scaler's record."""
    skipped_at = s.skipped_at
    text = (
        f"{s.total_steps} steps, {s.skipped_steps} skipped, {s.floor_hits} floor hits, {s.heals} heals, "
        f"final scale {s.scale}"
    )
    if s.overflow_steps or skipped_at:
        steps = f" (skipped steps {_cut(skipped_at, n)})" if skipped_at else ""
        text += f"; {s.overflow_steps} overflowing{steps}"
    if s.input_steps:
        text += f"; {_input_steps(s, n)}"
    if s.watch_backoffs:
        text += f"; --watch: {len(s.watch_backoffs)} routine backoff(s) counted, not raised"
    return text


def _input_steps(s: ScalerRecord, n: int) -> str:
    """``1 skipped for a non-finite input (step 2: args[0][1], sample 1; scale kept)``."""
    named = _cut((f"step {b.step}: {b.where}" for b in s.bad_inputs), n)
    return f"{s.input_steps} skipped for a non-finite input ({named}; data, not an overflow: scale kept)"


def ended_text(report: Summary, returncode: int | None = None) -> str | None:
    """What ended the run when it did not end well: the error, quoted, or the script's own exit status."""
    ended = _record(report).ended or Ended()
    if ended.exception:
        return f"the run ended with `{ended.exception}`"
    if ended.exit not in (None, 0):
        return f"the script called sys.exit({ended.exit!r}) at {ended.where or '?'}"
    if returncode is not None and returncode < 0:
        from .exits import died_text

        return died_text(-returncode, loaded=True)  # this process loaded ampsafe: it wrote the summary
    if returncode:
        return f"the command exited with status {returncode}"
    return None


def origin_text(o: Origin) -> str:
    """The origin a replay or the sentinel named: op, module, sample, kind."""
    sample = f", sample {o.sample}" if o.sample is not None else ""
    where = f" ({o.where})" if o.where else ""
    return f"{o.phase} pass of step {o.step}: {o.module or '<root>'}:{o.op}{sample}{where}, kind={o.kind!r} ({o.how})"


def problems(report: Summary, returncode: int | None = None) -> list[str]:
    """Everything that went wrong in the run, one sentence each; empty only when nothing overflowed, was
    skipped, failed or was bad (the one rule for "nothing to change")."""
    report = _record(report)
    out = []
    for s in report.scalers:
        if s.disabled_reason:
            continue
        if s.overflow_steps or s.skipped_steps or s.floor_hits or s.heals:
            skipped_at = s.skipped_at
            out.append(
                f"{s.class_name}: {s.overflow_steps} of {s.total_steps} steps overflowing, {s.skipped_steps} skipped"
                f"{' (steps ' + _cut(skipped_at, 10) + ')' if skipped_at else ''}, {s.floor_hits} floor "
                f"hits, {s.heals} heals{'; ' + _input_steps(s, 10) if s.input_steps else ''}"
            )
    out += [f"{s.class_name}: {s.static_scale.words}" for s in report.scalers if s.static_scale is not None]
    for g in report.guards:
        if g.skipped_steps:
            out.append(f"FP32 guard ({g.framework}): {g.skipped_steps} step(s) skipped")
        if g.exit_origin:
            out.append(f"the script stopped itself; its last forward: {origin_text(g.exit_origin)}")
    out += [f"{t.where}: {t.bad_boxes} bad box(es)" for t in report.targets if t.bad_boxes]
    ended = ended_text(report, returncode)
    if ended:
        out.append(ended)
    return out


def _summary_head(reports: list[RunSummary], scalers: list, guards: list) -> list[str]:
    """The first line of the exit summary, and one per guard whose optimizer steps ran unchecked."""
    if scalers:
        lines = [f"ampsafe run summary: {len(scalers)} GradScaler(s)"]
    elif guards:
        lines = ["ampsafe run summary: the script created no GradScaler; its optimizer steps were guarded"]
    elif any(g.unchecked_steps for r in reports for g in r.guards):
        lines = ["ampsafe run summary: no GradScaler; optimizer steps ran and none was checked by ampsafe (see below)"]
    else:
        lines = ["ampsafe run summary: no GradScaler and no optimizer step (nothing was guarded)"]
    for r in reports:
        for g in r.guards:
            if g.unchecked_steps:
                lines.append(
                    f"  [{g.framework}, pid {r.pid}] {g.unchecked_steps} optimizer step(s) ran unchecked: "
                    "their optimizer class was never constructed under ampsafe (built before ampsafe was installed)"
                    ", so neither the FP32 guard nor an ampsafe scaler saw them: import ampsafe.auto first"
                )
    return lines


def _guard_lines(pid, g: GuardRecord) -> list[str]:
    skipped = f" (steps {_cut(g.skipped_at, 8)})" if g.skipped_at else ""
    restored = (
        f"; the last skip restored {len(g.restored)} state tensor(s): {_cut(g.restored, 4)}" if g.restored else ""
    )
    lines = [
        f"  [{g.framework}, pid {pid}] FP32 guard on {g.model or 'the optimizer'}: "
        f"{g.total_steps} optimizer steps, {g.skipped_steps} skipped (non-finite loss or gradients)"
        f"{skipped}{restored}"
    ]
    if g.exit_origin:
        o = g.exit_origin
        data = f"; bad data: {_bad_sample(o)}" if o.kind == "input" else ""
        lines.append(f"  [{g.framework}, pid {pid}] the script stopped itself; {origin_text(o)}{data}")
    if g.no_scaler is not None and g.no_scaler.step is not None:
        lines.append(
            f"  [{g.framework}, pid {pid}] a float16 backward with no loss scaler ({g.no_scaler.why}) from step "
            f"{g.no_scaler.step}: the report gives the lines that add one"
        )
    return lines


def format_summary(reports: list[Summary], returncode: int | None = None) -> str:
    """One line per scaler (its steps / overflowing / skipped with the steps / floor hits / heals, or why it
    was disabled), one per FP32 guard that saw steps (skips, what a skip restored, what a replay at exit named),
    the bad detection targets, and what ended the run. The report reads the same records (:func:`problems`)."""
    reports = [_record(r) for r in reports]
    scalers = [(r.pid, s) for r in reports for s in r.scalers]
    guards = [(r.pid, g) for r in reports for g in r.guards if g.total_steps or g.exit_origin]
    targets = [(r.pid, t) for r in reports for t in r.targets if t.bad_boxes]
    lines = _summary_head(reports, scalers, guards)
    for pid, s in scalers:
        head = f"  [{s.framework}, pid {pid}] {s.class_name}: "
        if s.disabled_reason:
            guarded = " (its optimizer steps went through the FP32 guard)" if guards else ""
            lines.append(head + _disabled_text(s.disabled_reason) + guarded)
            continue
        static = f"; {s.static_scale.words} (see report.md)" if s.static_scale is not None else ""
        lines.append(head + _scaler_counts(s, 8) + static)
    for pid, g in guards:
        lines += _guard_lines(pid, g)
    for pid, t in targets:
        lines.append(
            f"  [{t.where}, pid {pid}] {t.bad_boxes} bad box(es) in {t.calls} batch(es) checked ({t.policy}): {t.first}"
        )
    for r in reports:
        ended = ended_text(r, None)
        if ended:
            lines.append(f"  [pid {r.pid}] {ended}")
    return "\n".join(lines)


def _disabled_text(reason: str) -> str:
    return reason if reason.startswith("disabled") else f"disabled ({reason})"


def _swap_neck(config: Path | None) -> SwapNeck | None:
    """The ``ampsafe swap-neck`` command when ``config``'s neck has a safe counterpart (tried in a scratch folder)."""
    if config is None or not Path(config).is_file():
        return None
    try:
        from ..errors import ConfigError
        from ..patches.swap import swap_neck
    except ImportError:
        return None
    out = Path(config).with_name(f"{Path(config).stem}_ampsafe{Path(config).suffix}")
    with tempfile.TemporaryDirectory(prefix="ampsafe-swap-") as tmp:
        try:
            swap_neck(Path(config), out=Path(tmp) / out.name)
        except ConfigError as exc:
            return SwapNeck(applicable=False, reason=str(exc))
        except Exception as exc:  # a config the swap cannot read: say so, don't fail the report
            return SwapNeck(applicable=False, reason=f"{type(exc).__name__}: {exc}")
    return SwapNeck(applicable=True, command=f"ampsafe swap-neck {config} -o {out}", config=str(out))


def _swap_and_run(config: Path | None, command: list[str] | None, run_args: list[str] | None) -> SwapNeck | None:
    """:func:`_swap_neck`, with the ``ampsafe run`` line that trains on the swapped config (the same options)."""
    swap = _swap_neck(config)
    if swap is None or not swap.applicable or not command:
        return swap
    cmd = [swap.config if a == str(config) else a for a in command]
    return dataclasses.replace(swap, run=shlex.join(["ampsafe", "run", *(run_args or []), "--", *cmd]))


def _island_line(paths, level: str | None = None) -> str:
    lvl = f', level="{level}"' if level else ""
    return f'ampsafe.patch(model, policy="island"{lvl}, paths={json.dumps(list(paths))})'


def _hf_keep_line(report: RunSummary) -> str | None:
    """HF transformers' own fix for the healed modules of an HF model (the summary's ``hf_keep_in_fp32``, see
    :mod:`ampsafe.run.hf`): ``model._keep_in_fp32_modules = [...]``, or None when no HF model was healed."""
    names: list[str] = []
    for s in report.scalers:
        names += [n for n in s.hf_keep_in_fp32 or () if n not in names]
    return f"model._keep_in_fp32_modules = {json.dumps(names)}" if names else None


def _bad_sample(o: Origin) -> str:
    """Which sample of which batch a non-finite input came in with (steps count the batches that stepped)."""
    sample = f"sample {o.sample}" if o.sample is not None else "a sample"
    return f"{sample} of the batch of step {o.step} (batch {o.step} from the run's start, counting from 0)"


def _data_advice(g: GuardRecord, o: Origin) -> str:
    """A NaN/Inf that came in with the data: which sample to fix, and that the model needs no change."""
    return (
        f"{g.framework}: the script stopped itself before optimizer step {o.step} on bad data: a non-finite value "
        f"came in with the model's input, {_bad_sample(o)}{' at ' + o.where if o.where else ''}. Find that sample "
        f"in the data (print the ids of the batch of step {o.step}, e.g. the targets' image_id) and fix or drop "
        f"it; the model, its precision and its config need no change (no island, no neck swap). Its last "
        f"forward: {origin_text(o)}."
    )


def _guard_advice(g: GuardRecord, watch: bool) -> list[str]:
    """What to do about an FP32 guard's skipped steps, and about a script that stopped itself."""
    out = []
    if g.exit_origin and g.exit_origin.kind == "input":
        out.append(_data_advice(g, g.exit_origin))
    elif g.exit_origin:
        o = g.exit_origin
        out.append(
            f"{g.framework}: the script stopped itself before optimizer step {o.step}; its last forward "
            f"names {origin_text(o)}: see the kind's advice in the message."
        )
    if g.skipped_steps:
        restored = (
            f" Each skip put back the state the step's forward had moved ({_cut(g.restored, 6)} at the last)."
            if g.restored
            else ""
        )
        out.append(
            f"{g.framework}: {g.skipped_steps} optimizer step(s) had a non-finite loss or gradients and "
            f"were skipped (steps {_cut(g.skipped_at, 10)}).{restored} "
            + (
                "The run stopped at the first one (--watch): its error names the op, module, pass and sample."
                if watch
                else "`ampsafe run --watch` stops at the first one and names its op, module, pass and sample."
            )
        )
    return out


def _backoff_advice(s: ScalerRecord) -> str:
    """Many backoffs without a floor hit: lost steps, and what the scan of one of their batches found."""
    fell = (
        f" (the scale went from {s.first_scale:g} to {s.scale:g})"
        if s.first_scale is not None and s.scale is not None
        else ""
    )
    text = (
        f"{s.class_name}: {s.overflow_steps} of {s.total_steps} steps overflowed and were skipped (steps "
        f"{_cut(s.skipped_at, 10)}){fell} without reaching the floor: each was a lost step. "
    )
    scan = s.backoff_scan or BackoffScan()
    found = (
        f"`ampsafe.scan` on the batch of step {scan.step} finds {len(scan.paths)} risky path(s) "
        f"starting at {_cut(scan.paths, 6)}"
    )
    if scan.modules and scan.island_works is False:
        return text + f"{found}; `{_island_line(scan.modules)}` was {scan.island_trial}." + _keep_advice(scan)
    if scan.modules:
        tried = f" ({scan.island_trial})" if scan.island_trial else ""
        return text + (
            f"{found}; island them up front: `{_island_line(scan.modules)}`{tried}"
            + "".join(
                f" ({where}: `{_island_line(scan.modules, level)}`)" for level, (where, _) in s.island_levels.items()
            )
            + "."
            + _keep_advice(scan)
        )
    if scan.error:
        return text + f"The scan of that step's batch could not run ({scan.error})."
    return text + (
        "`ampsafe.scan` on that step's batch found no path near float16's edge in the forward: the "
        "overflow is in the backward, where a smaller starting scale (init_scale) loses fewer steps."
    )


def _keep_advice(scan: BackoffScan) -> str:
    """HF's ``_keep_in_fp32_modules`` line of an HF model's backoff scan, or the measured reason for none."""
    if scan.hf_keep:
        return (
            f" In HF's own words, for a model `from_pretrained(..., dtype=torch.float16)` loads (set on the model "
            f"class before it loads; under autocast the island line is the fix): `{scan.hf_keep}` ({scan.hf_keep_note})."
        )
    return f" {scan.hf_keep_note[0].upper()}{scan.hf_keep_note[1:]}." if scan.hf_keep_note else ""


def _input_advice(s: ScalerRecord) -> str:
    """Steps a scaler skipped for their data: which samples to fix, and that the model needs no change."""
    first = s.bad_inputs[0] if s.bad_inputs else None
    which = (
        f" The first: {first.where} of the batch of step {first.step}"
        f"{' (sample ' + str(first.sample) + ')' if first.sample is not None else ''}."
        if first is not None
        else ""
    )
    return (
        f"{s.class_name}: {s.input_steps} step(s) had a non-finite value in the model's input and were skipped "
        f"with the loss scale kept (steps {_cut((b.step for b in s.bad_inputs), 10)}): bad data, not a float16 "
        f"overflow.{which} Find those samples in the data (print the ids of those steps' batches) and fix or "
        "drop them; the model, its precision and its config need no change (no island, no neck swap)."
    )


def _scaler_advice(s: ScalerRecord) -> list[str]:
    if s.disabled_reason:
        return []
    out = [_input_advice(s)] if s.input_steps else []
    return out + _overflow_advice(s)


def _overflow_advice(s: ScalerRecord) -> list[str]:
    out = [_below_floor_advice(s)] if s.below_floor else []
    if s.refusals:
        return out + [_refusal_advice(s)]
    if s.floor_hits and not s.heal_records and not s.below_floor and s.on_floor != "heal":
        return out + [
            f"{s.class_name}: {s.floor_hits} floor hits and no heal (on_floor={s.on_floor or 'raise'!r}): run with "
            "`--on-floor heal` so the offending paths become FP32 islands, then apply the patch line this report "
            "gives."
        ]
    if s.floor_hits and not s.heal_records and not s.below_floor:  # on_floor was heal: never advise it
        return out + [
            f"{s.class_name}: {s.floor_hits} floor hit(s) with on_floor={s.on_floor!r} and neither a heal nor the "
            "reason for none recorded: the process ended before its heal at the floor did (how the run ended is "
            "below). `ampsafe.scan(model, batch)` on a batch of that step names the paths near float16's max."
        ]
    if s.overflow_steps and not s.floor_hits and not s.heal_records:
        return out + [_backoff_advice(s)]
    return out


def _below_floor_advice(s: ScalerRecord) -> str:
    """The floor moved down for a backward-only overflow: where, to what, and what keeps it up for good."""
    last = s.below_floor[-1]
    modules = sorted({b.module for b in s.below_floor if b.module is not None})
    lost = (
        f"; at {last.scale:g}, {last.lost:.2%} of the gradient's non-zero elements flush to zero" if last.lost else ""
    )
    where = f" in {', '.join(m or '<root>' for m in modules)}" if modules else ""
    return (
        f"{s.class_name}: the backward overflowed float16 at the floor{where} with the forward in range, so the scale "
        f"went below the floor {len(s.below_floor)} time(s), to {last.scale:g} at step {last.step} (as the "
        f"framework's own scaler would){lost}. {last.reason}. To keep the scale up: compute that gradient in "
        'float32 (an FP32 island of the module that makes it: ampsafe.patch(model, policy="island", '
        "paths=[...])), or scale the loss down where it is summed (a mean over tokens instead of a sum)."
    )


def _refusal_advice(s: ScalerRecord) -> str:
    """A heal at the floor healed nothing: the measured reason, never advice to turn on what was on."""
    step, why = s.refusals[-1].step, s.refusals[-1].reason
    reason = why.split("could not heal it: ", 1)[-1] if "could not heal it: " in why else why
    return (
        f"{s.class_name}: the heal at the floor (on_floor={s.on_floor!r}) healed nothing at step {step}: {reason} "
        "That is the case to fix; the options this run had are not it."
    )


def _overflowed(report: RunSummary) -> bool:
    """Whether float16 overflowed in the run (a scaler's overflowing step, floor hit or heal): only then is a neck
    swap, an AMP fix, advice. Not for a clean run, an FP32 run, or bad data (a non-finite input is data)."""
    return any(s.overflowed for s in report.scalers)


def permanent_fix(
    report: Summary,
    *,
    config: Path | None = None,
    command: list[str] | None = None,
    run_args: list[str] | None = None,
    returncode: int | None = None,
) -> PermanentFix:
    """What to change so that the next run needs no healing (a :class:`~ampsafe.run.records.PermanentFix`;
    :func:`to_markdown` words it).

    ``patch``: the healed modules as one island line (the modules each heal's log line named);
    ``level_lines`` (``paddle_o2``): the same modules for a level whose island line differs, with its advice in
    ``level_islands`` (Paddle O2 islands after ``paddle.amp.decorate``: an island keeps their compute in
    float32, where ``decorate``'s ``excluded_layers`` keeps only their parameters); ``advice``: one sentence per
    other problem (skipped steps, many backoffs, bad targets, a script that stopped itself)."""
    report = _record(report)
    healed = _healed_paths(report)
    all_paths = [p for paths in healed.values() for p in paths]
    levels = _level_islands(report, healed)
    advice = [a for g in report.guards for a in _guard_advice(g, report.watch)]
    from .report_underflow import no_scaler_advice, static_scale_advice

    advice += no_scaler_advice(report)
    advice += static_scale_advice(report)
    advice += [
        f"{t.where}: {t.bad_boxes} bad box(es) ({t.policy}); first: {t.first}. Fix the "
        "annotations, or keep `--on-bad-target drop`."
        for t in report.targets
        if t.bad_boxes
    ]
    advice += [a for s in report.scalers for a in _scaler_advice(s)]
    ended = ended_text(report, returncode)
    if ended and not any(g.exit_origin for g in report.guards):
        advice.append(f"{ended[0].upper()}{ended[1:]}.")
    return PermanentFix(
        patch=_island_line(all_paths) if all_paths else None,
        level_islands={key: words for key, (_, words) in levels.items()},
        swap_neck=_swap_and_run(config, command, run_args) if _overflowed(report) else None,
        advice=tuple(advice),
        problems=tuple(problems(report, returncode)),
        hf_keep_in_fp32=_hf_keep_line(report),
        level_lines={key: line for key, (line, _) in levels.items()},
    )


def _scaler_line(s: ScalerRecord) -> str:
    if s.disabled_reason:
        return f"- `{s.class_name}` ({s.framework}): {_disabled_text(s.disabled_reason)}"
    heals = "; ".join(
        f"step {h.step}: {', '.join(h.paths) or '(no paths)'}"
        + (" (its gradient overflowed at the floor, the forward in range)" if h.cause == "backward" else "")
        + (
            " (a generation's forward overflowed: generate sampled from NaN)"
            if h.cause == "generation overflow"
            else ""
        )
        + (
            f" ({', '.join(h.widened)}: float32 policy for the run, a value past 65504 passes between them)"
            if h.widened
            else ""
        )
        for h in s.heal_records
    )
    below = "; ".join(f"step {b.step}: {b.floor:g} -> {b.scale:g}" for b in s.below_floor[:10])
    return (
        f"- `{s.class_name}` ({s.framework}{', model ' + s.model if s.model else ''}): "
        + _scaler_counts(s, 20)
        + (f"; heals: {heals}" if heals else "")
        + (f"; below the floor: {below}" if below else "")
        + _origins_text(s)
    )


def _origins_text(s: ScalerRecord) -> str:
    """``; the backward went non-finite first in value_head (steps 0-10)``: each module the overflowing steps'
    gradients named, with the steps."""
    if not s.overflow_origins:
        return ""
    steps: dict[str, list[int]] = {}
    for o in s.overflow_origins:
        steps.setdefault(f"{o.module or '<root>'} ({o.kind} gradient)", []).append(o.step)
    named = "; ".join(f"{m} at steps {_cut(v, 8)}" for m, v in steps.items())
    return f"; the overflowing steps' gradients went non-finite first in: {named}"


def _happened(report: RunSummary, returncode: int | None) -> list[str]:
    """The report's "What happened": one line per scaler, guard, checked target entry point, and the ending."""
    lines = [_scaler_line(s) for s in report.scalers] or ["- the script created no GradScaler"]
    for g in report.guards:
        if g.total_steps:
            lines.append(
                f"- FP32 guard ({g.framework}{', model ' + g.model if g.model else ''}): "
                f"{g.total_steps} optimizer steps outside a scaler, {g.skipped_steps} skipped "
                f"(non-finite loss or gradients){': steps ' + _cut(g.skipped_at, 20) if g.skipped_at else ''}"
                f"{'; non-finite gradients in ' + _cut(g.offenders, 5) if g.offenders else ''}"
                f"{'; the last skip restored ' + _cut(g.restored, 8) if g.restored else ''}"
            )
        if g.exit_origin:
            lines.append(f"- the script stopped itself; {origin_text(g.exit_origin)}")
    for t in report.targets:
        if t.calls:
            lines.append(
                f"- targets, {t.where}: {t.calls} batches checked, {t.bad_boxes} bad boxes ({t.policy})"
                f"{': first ' + t.first if t.first else ''}"
            )
    ended = ended_text(report, returncode)
    if ended:
        lines.append(f"- {ended}")
    return lines


_PATCH_WORDS = (
    "The scaler healed these modules into FP32 islands during the run (the modules its heal line named). "
    "Island them up front, after building the model and before creating the optimizer, and the next run "
    "needs no heal:"
)
_HF_WORDS = (
    "The model is an HF transformers model. In HF's own words (the mechanism behind T5's "
    '`_keep_in_fp32_modules = ["wo"]`), the same modules keep their weights in float32 when HF casts the '
    "rest to float16: `from_pretrained(..., dtype=torch.float16)` reads the list through the model's "
    "`_get_dtype_plan`, so set it on the model class before `from_pretrained` builds one. It decides the "
    "weights' dtype; under autocast, which computes these layers in float16 whatever their weights, the "
    "patch line above is the fix:"
)
_SWAP_WORDS = (
    "The config's neck has an AMP-safe counterpart (a BatchNorm after each unnormalized conv; upstream "
    "checkpoints load with only the new BatchNorm keys missing):"
)


def _fix_lines(fix: PermanentFix) -> list[str]:
    """The report's "Make the fix permanent": the patch line, HF's line, the level lines, the neck swap, advice."""
    lines: list[str] = []
    if fix.patch:
        lines += [_PATCH_WORDS, "", "```python", "import ampsafe", fix.patch, "```", ""]
    if fix.hf_keep_in_fp32:
        lines += [_HF_WORDS, "", "```python", fix.hf_keep_in_fp32, "```", ""]
    for key, advice in fix.level_islands.items():
        lines += [advice, "", "```python", fix.level_lines[key], "```", ""]
    swap = fix.swap_neck
    if swap and swap.applicable:
        lines += [_SWAP_WORDS, "", "```bash", swap.command, *([swap.run] if swap.run else []), "```", ""]
    elif swap:
        lines += [f"No neck swap for this config: {swap.reason}", ""]
    lines += [f"- {advice}" for advice in fix.advice]
    if not fix.problems and not fix.patch and not fix.advice:
        lines.append("Nothing to change: nothing overflowed, no step was skipped, no bad target, the run ended well.")
    return lines


def to_markdown(
    report: Summary,
    fix: PermanentFix | Mapping[str, Any],
    *,
    command: list[str] | None = None,
    plot: str | None = "scale.png",
    returncode: int | None = None,
    headroom_plot: str | None = None,
) -> str:
    report = _record(report)
    fix = fix if isinstance(fix, PermanentFix) else PermanentFix.from_dict(fix)
    lines = [f"# ampsafe run report (pid {report.pid})", ""]
    if command:
        lines += [f"Command: `{shlex.join(command)}`", ""]
    if report.options is not None:
        shown = ", ".join(f"{k}={v!r}" for k, v in report.options.to_dict().items() if k not in ("quiet", "report"))
        lines += [f"Options: {shown}", ""]
    lines += ["## What happened", "", *_happened(report, returncode)]
    if plot:
        lines += ["", f"![loss scale]({plot})"]
    from .report_headroom import headroom_lines

    headroom = headroom_lines(report, headroom_plot)
    lines += ["", *headroom] if headroom else [""]  # headroom's lines end with a blank one
    from .report_underflow import underflow_lines

    lines += underflow_lines(report)  # its lines end with a blank one
    lines += ["## Make the fix permanent", "", *_fix_lines(fix)]
    return "\n".join(lines).rstrip() + "\n"


def _plot(report: RunSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    drew = False
    for s in report.scalers:
        steps = s.steps
        if not steps:
            continue
        drew = True
        xs = [r[0] for r in steps]
        ax.step(xs, [r[1] for r in steps], where="post", label=f"{s.framework} loss scale")
        over = [(r[0], r[1]) for r in steps if r[2]]
        if over:
            ax.scatter(*zip(*over), marker="x", color="tab:red", zorder=3, label="overflow (step skipped)")
        floor = [(r[0], r[1]) for r in steps if r[3]]
        if floor:
            ax.scatter(*zip(*floor), marker="v", color="black", zorder=4, label="floor hit")
        for i, h in enumerate(s.heal_records):
            ax.axvline(h.step, color="tab:green", linestyle="--", label="heal" if i == 0 else None)
    if drew:
        ax.set_yscale("log", base=2)
        ax.set_ylabel("loss scale")
    for g in report.guards:
        if g.skipped_at:
            drew = True
            for i, step in enumerate(g.skipped_at):
                ax.axvline(step, color="tab:orange", alpha=0.7, label="FP32 guard: step skipped" if i == 0 else None)
    if not drew:
        ax.text(0.5, 0.5, "no scaled or skipped step to plot", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_title(f"ampsafe run, pid {report.pid}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _headline(fix: PermanentFix) -> str:
    if fix.patch:
        return f"heals happened; the patch line that makes them permanent: {fix.patch}"
    if fix.advice:
        return fix.advice[0]
    if fix.problems:
        return fix.problems[0]
    if fix.swap_neck and fix.swap_neck.applicable:
        return f"the neck has a safe counterpart: {fix.swap_neck.command}"
    return "nothing to change"


def write_reports(
    reports: list[Summary],
    directory: Path,
    *,
    config: Path | None = None,
    command: list[str] | None = None,
    run_args: list[str] | None = None,
    returncode: int | None = None,
) -> list[tuple[Path, str]]:
    """Write report.md / report.json / scale.png per process (``directory/<pid>/`` when several trained);
    returns ``(report.md path, headline)`` for each. ``returncode``: the command's exit status."""
    records = [(r, _record(r)) for r in reports]
    chosen = [(r, s) for r, s in records if _active(s)] or records[:1]
    directory = Path(directory)
    written = []
    for raw, report in chosen:
        folder = directory if len(chosen) == 1 else directory / str(report.pid)
        folder.mkdir(parents=True, exist_ok=True)
        fix = permanent_fix(report, config=config, command=command, run_args=run_args, returncode=returncode)
        plot: str | None = "scale.png"
        headroom: str | None = None
        try:
            _plot(report, folder / "scale.png")
            from .report_headroom import PLOT, plot_headroom

            headroom = PLOT if plot_headroom(report, folder / PLOT) else None
        except ImportError:
            plot = None  # matplotlib is optional: the report says what the plot would have shown
        md = to_markdown(report, fix, command=command, plot=plot, returncode=returncode, headroom_plot=headroom)
        (folder / "report.md").write_text(md, encoding="utf-8")
        summary = report.to_dict() if raw is report else raw  # the child's JSON as it wrote it
        data = {**summary, "fix": fix.to_dict(), "command": command, "returncode": returncode}
        (folder / "report.json").write_text(json.dumps(data, indent=1, default=repr), encoding="utf-8")
        written.append((folder / "report.md", _headline(fix)))
    return written
