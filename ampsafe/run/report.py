"""``ampsafe run --report DIR``: what happened in a run, and what to change so that the next run needs no healing.

Per Python process of the command that trained something, ``DIR`` gets (in ``DIR/<pid>/`` when several did):

* ``report.md``: the scalers (steps, overflows, skips, floor hits, heals, or why one was disabled), the FP32
  guard's skipped steps, the bad detection targets, and **the permanent fix**: the healed module paths as a
  ready ``ampsafe.patch(model, policy="island", paths=[...])`` line (for Paddle O2 the ``excluded_layers`` of
  ``paddle.amp.decorate`` too), and the ``ampsafe swap-neck`` command when the ``-c`` config's neck has an
  AMP-safe counterpart;
* ``report.json``: the same as data (the process's summary plus ``fix``);
* ``scale.png``: the loss scale per step, the overflowing / skipped steps and the heals (matplotlib, Agg).

Framework-neutral: it reads the summaries ``ampsafe.auto`` writes (JSON), imports no framework, and imports
matplotlib only to draw.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from ..core.modpath import parts

__all__ = ["write_reports", "permanent_fix", "to_markdown", "format_summary", "problems"]


def _active(report: dict) -> bool:
    return bool(
        report.get("scalers")
        or any(g.get("total_steps") for g in report.get("guards", []))
        or any(t.get("calls") for t in report.get("targets", []))
        or any(g.get("exit_origin") for g in report.get("guards", []))
        or report.get("ended")
    )


def _healed_paths(report: dict) -> dict[str, list[str]]:
    """framework -> the module paths healed (in heal order, each once): the heal records the scalers kept, which
    are the modules each heal's log line named."""
    out: dict[str, list[str]] = {}
    for s in report.get("scalers", []):
        for h in s.get("heal_records", []):
            paths = out.setdefault(s["framework"], [])
            paths += [p for p in h.get("paths", []) if p not in paths]
    return out


def _level_islands(report: dict, healed: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """``<framework>_<level>`` -> (island line, advice) for each level whose island line differs from the default
    (the framework's ``Amp.island_levels``, recorded on its scalers), for the frameworks that healed."""
    out: dict[str, tuple[str, str]] = {}
    for s in report.get("scalers", []):
        for level, (_, advice) in (s.get("island_levels") or {}).items():
            if healed.get(s["framework"]):
                out[f"{s['framework']}_{level.lower()}"] = (_island_line(healed[s["framework"]], level), advice)
    return out


def _cut(items: list, n: int) -> str:
    """The first ``n`` items, then "…" when there are more."""
    return ", ".join(map(str, items[:n])) + (", …" if len(items) > n else "")


def scaler_facts(s: dict) -> dict:
    """One scaler's record as the summary and the report both word it."""
    records = s.get("steps") or []
    skipped_at = [r[0] for r in records if r[2]]
    scales = [r[1] for r in records]
    return {
        "steps": s.get("total_steps", 0),
        "overflowing": s.get("overflow_steps", 0),
        "skipped": s.get("skipped_steps", 0),
        "skipped_at": skipped_at,
        "floor_hits": s.get("floor_hits", 0),
        "heals": s.get("heals", 0),
        "first_scale": scales[0] if scales else None,
        "final_scale": s.get("scale"),
        "watch_backoffs": len(s.get("watch_backoffs") or []),
    }


def _scaler_counts(f: dict, n: int) -> str:
    """``6 steps, 6 skipped, 3 floor hits, 0 heals, final scale 1.0; 6 overflowing (steps 0, 1, …)``: the
    summary's and the report's words for one scaler's record."""
    text = (
        f"{f['steps']} steps, {f['skipped']} skipped, {f['floor_hits']} floor hits, {f['heals']} heals, "
        f"final scale {f['final_scale']}"
    )
    if f["overflowing"] or f["skipped_at"]:
        steps = f" (skipped steps {_cut(f['skipped_at'], n)})" if f["skipped_at"] else ""
        text += f"; {f['overflowing']} overflowing{steps}"
    if f["watch_backoffs"]:
        text += f"; --watch: {f['watch_backoffs']} routine backoff(s) counted, not raised"
    return text


def ended_text(report: dict, returncode: int | None = None) -> str | None:
    """What ended the run when it did not end well: the error, quoted, or the script's own exit status."""
    ended = report.get("ended") or {}
    if ended.get("exception"):
        return f"the run ended with `{ended['exception']}`"
    if ended.get("exit") not in (None, 0):
        return f"the script called sys.exit({ended['exit']!r}) at {ended.get('where', '?')}"
    if returncode:
        return f"the command exited with status {returncode}"
    return None


def origin_text(o: dict) -> str:
    """The origin a replay or the sentinel named: op, module, sample, kind."""
    sample = f", sample {o['sample']}" if o.get("sample") is not None else ""
    where = f" ({o['where']})" if o.get("where") else ""
    return (
        f"{o['phase']} pass of step {o['step']}: {o['module'] or '<root>'}:{o['op']}{sample}{where}, "
        f"kind={o['kind']!r} ({o.get('how', '')})"
    )


def problems(report: dict, returncode: int | None = None) -> list[str]:
    """Everything that went wrong in the run, one sentence each; empty only when nothing overflowed, was
    skipped, failed or was bad (the one rule for "nothing to change")."""
    out = []
    for s in report.get("scalers", []):
        if s.get("disabled_reason"):
            continue
        f = scaler_facts(s)
        if f["overflowing"] or f["skipped"] or f["floor_hits"] or f["heals"]:
            out.append(
                f"{s['class']}: {f['overflowing']} of {f['steps']} steps overflowing, {f['skipped']} skipped"
                f"{' (steps ' + _cut(f['skipped_at'], 10) + ')' if f['skipped_at'] else ''}, {f['floor_hits']} floor "
                f"hits, {f['heals']} heals"
            )
    for g in report.get("guards", []):
        if g.get("skipped_steps"):
            out.append(f"FP32 guard ({g['framework']}): {g['skipped_steps']} step(s) skipped")
        if g.get("exit_origin"):
            out.append(f"the script stopped itself; its last forward: {origin_text(g['exit_origin'])}")
    for t in report.get("targets", []):
        if t.get("bad_boxes"):
            out.append(f"{t['where']}: {t['bad_boxes']} bad box(es)")
    ended = ended_text(report, returncode)
    if ended:
        out.append(ended)
    return out


def format_summary(reports: list[dict], returncode: int | None = None) -> str:
    """One line per scaler (its steps / overflowing / skipped with the steps / floor hits / heals, or why it
    was disabled), one per FP32 guard that saw steps (skips, what a skip restored, what a replay at exit named),
    the bad detection targets, and what ended the run. The report reads the same records (:func:`problems`)."""
    lines = []
    scalers = [(r["pid"], s) for r in reports for s in r["scalers"]]
    guards = [
        (r["pid"], g) for r in reports for g in r.get("guards", []) if g.get("total_steps") or g.get("exit_origin")
    ]
    targets = [(r["pid"], t) for r in reports for t in r.get("targets", []) if t.get("bad_boxes")]
    if scalers:
        lines.append(f"ampsafe run summary: {len(scalers)} GradScaler(s)")
    elif guards:
        lines.append("ampsafe run summary: the script created no GradScaler; its optimizer steps were guarded")
    elif any(g.get("unchecked_steps") for r in reports for g in r.get("guards", [])):
        lines.append(
            "ampsafe run summary: no GradScaler; optimizer steps ran and none was checked by ampsafe (see below)"
        )
    else:
        lines.append("ampsafe run summary: no GradScaler and no optimizer step (nothing was guarded)")
    for r in reports:
        for g in r.get("guards", []):
            if g.get("unchecked_steps"):
                lines.append(
                    f"  [{g['framework']}, pid {r['pid']}] {g['unchecked_steps']} optimizer step(s) ran unchecked: "
                    "their optimizer class was never constructed under ampsafe (built before ampsafe was installed)"
                    ", so neither the FP32 guard nor an ampsafe scaler saw them: import ampsafe.auto first"
                )
    for pid, s in scalers:
        head = f"  [{s['framework']}, pid {pid}] {s['class']}: "
        if s.get("disabled_reason"):
            guarded = " (its optimizer steps went through the FP32 guard)" if guards else ""
            lines.append(head + _disabled_text(s["disabled_reason"]) + guarded)
            continue
        f = scaler_facts(s)
        lines.append(head + _scaler_counts(f, 8))
    for pid, g in guards:
        skipped = f" (steps {_cut(g['skipped_at'], 8)})" if g.get("skipped_at") else ""
        restored = (
            f"; the last skip restored {len(g['restored'])} state tensor(s): {_cut(g['restored'], 4)}"
            if g.get("restored")
            else ""
        )
        lines.append(
            f"  [{g['framework']}, pid {pid}] FP32 guard on {g.get('model') or 'the optimizer'}: "
            f"{g['total_steps']} optimizer steps, {g['skipped_steps']} skipped (non-finite loss or gradients)"
            f"{skipped}{restored}"
        )
        if g.get("exit_origin"):
            lines.append(f"  [{g['framework']}, pid {pid}] the script stopped itself; {origin_text(g['exit_origin'])}")
    for pid, t in targets:
        lines.append(
            f"  [{t['where']}, pid {pid}] {t['bad_boxes']} bad box(es) in {t['calls']} batch(es) checked "
            f"({t['policy']}): {t['first']}"
        )
    for r in reports:
        ended = ended_text(r, None)
        if ended:
            lines.append(f"  [pid {r['pid']}] {ended}")
    return "\n".join(lines)


def _disabled_text(reason: str) -> str:
    return reason if reason.startswith("disabled") else f"disabled ({reason})"


def _attr_path(path: str) -> str:
    """``backbone.stages.0.conv`` -> ``model.backbone.stages[0].conv`` (Python that reaches the module)."""
    out = "model"
    for part in parts(path):
        out += f"[{part}]" if part.isdigit() else f".{part}" if part.isidentifier() else f"[{part!r}]"
    return out


def _swap_neck(config: Path | None) -> dict | None:
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
            return {"applicable": False, "reason": str(exc)}
        except Exception as exc:  # a config the swap cannot read: say so, don't fail the report
            return {"applicable": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {"applicable": True, "command": f"ampsafe swap-neck {config} -o {out}", "config": str(out)}


def _island_line(paths: list[str], level: str | None = None) -> str:
    lvl = f', level="{level}"' if level else ""
    return f'ampsafe.patch(model, policy="island"{lvl}, paths={json.dumps(paths)})'


def _hf_keep_line(report: dict) -> str | None:
    """HF transformers' own fix for the healed modules of an HF model (the summary's ``hf_keep_in_fp32``, see
    :mod:`ampsafe.run.hf`): ``model._keep_in_fp32_modules = [...]``, or None when no HF model was healed."""
    names: list[str] = []
    for s in report.get("scalers", []):
        names += [n for n in s.get("hf_keep_in_fp32") or () if n not in names]
    return f"model._keep_in_fp32_modules = {json.dumps(names)}" if names else None


def permanent_fix(
    report: dict,
    *,
    config: Path | None = None,
    command: list[str] | None = None,
    run_args: list[str] | None = None,
    returncode: int | None = None,
) -> dict:
    """What to change so that the next run needs no healing (data; :func:`to_markdown` words it).

    ``patch``: the healed modules as one island line (the modules each heal's log line named);
    ``<framework>_<level>`` (``paddle_o2``): the same modules for a level whose island line differs, with its
    advice in ``level_islands`` (Paddle O2 islands after ``paddle.amp.decorate``: an island keeps their compute in
    float32, where ``decorate``'s ``excluded_layers`` keeps only their parameters); ``advice``: one sentence per
    other problem (skipped steps, many backoffs, bad targets, a script that stopped itself)."""
    fix: dict = {"patch": None, "level_islands": {}, "swap_neck": None, "advice": [], "problems": []}
    fix["problems"] = problems(report, returncode)
    healed = _healed_paths(report)
    all_paths = [p for paths in healed.values() for p in paths]
    if all_paths:
        fix["patch"] = _island_line(all_paths)
    fix["hf_keep_in_fp32"] = _hf_keep_line(report)
    for key, (line, advice) in _level_islands(report, healed).items():
        fix[key] = line  # e.g. fix["paddle_o2"]
        fix["level_islands"][key] = advice
    swap = _swap_neck(config)
    if swap is not None:
        fix["swap_neck"] = swap
        if swap["applicable"] and command:
            cmd = [swap["config"] if a == str(config) else a for a in command]
            swap["run"] = shlex.join(["ampsafe", "run", *(run_args or []), "--", *cmd])  # the same run options
    watch = (report.get("options") or {}).get("watch")
    for g in report.get("guards", []):
        if g.get("exit_origin"):
            o = g["exit_origin"]
            what = "fix or drop that sample" if o["kind"] == "input" else "see the kind's advice in the message"
            fix["advice"].append(
                f"{g['framework']}: the script stopped itself before optimizer step {o['step']}; its last forward "
                f"names {origin_text(o)}: {what}."
            )
        if g.get("skipped_steps"):
            restored = (
                f" Each skip put back the state the step's forward had moved ({_cut(g['restored'], 6)} at the last)."
                if g.get("restored")
                else ""
            )
            fix["advice"].append(
                f"{g['framework']}: {g['skipped_steps']} optimizer step(s) had a non-finite loss or gradients and "
                f"were skipped (steps {_cut(g['skipped_at'], 10)}).{restored} "
                + (
                    "The run stopped at the first one (--watch): its error names the op, module, pass and sample."
                    if watch
                    else "`ampsafe run --watch` stops at the first one and names its op, module, pass and sample."
                )
            )
    for t in report.get("targets", []):
        if t.get("bad_boxes"):
            fix["advice"].append(
                f"{t['where']}: {t['bad_boxes']} bad box(es) ({t['policy']}); first: {t['first']}. Fix the "
                "annotations, or keep `--on-bad-target drop`."
            )
    for s in report.get("scalers", []):
        if s.get("disabled_reason"):
            continue
        f = scaler_facts(s)
        if f["floor_hits"] and not s.get("heal_records"):
            fix["advice"].append(
                f"{s['class']}: {f['floor_hits']} floor hits and no heal: run with `--on-floor heal` (the default) "
                "so the offending paths become FP32 islands, then apply the patch line this report gives."
            )
        elif f["overflowing"] and not f["floor_hits"] and not s.get("heal_records"):
            scan = s.get("backoff_scan") or {}
            fell = (
                f" (the scale went from {f['first_scale']:g} to {f['final_scale']:g})"
                if f["first_scale"] is not None and f["final_scale"] is not None
                else ""
            )
            text = (
                f"{s['class']}: {f['overflowing']} of {f['steps']} steps overflowed and were skipped (steps "
                f"{_cut(f['skipped_at'], 10)}){fell} without reaching the floor: each was a lost step. "
            )
            if scan.get("modules"):
                text += (
                    f"`ampsafe.scan` on the batch of step {scan['step']} finds {len(scan['paths'])} risky path(s) "
                    f"starting at {_cut(scan['paths'], 6)}; island them up front: `{_island_line(scan['modules'])}`"
                    + "".join(
                        f" ({where}: `{_island_line(scan['modules'], level)}`)"
                        for level, (where, _) in (s.get("island_levels") or {}).items()
                    )
                    + "."
                )
            elif scan.get("error"):
                text += f"The scan of that step's batch could not run ({scan['error']})."
            else:
                text += (
                    "`ampsafe.scan` on that step's batch found no path near float16's edge in the forward: the "
                    "overflow is in the backward, where a smaller starting scale (init_scale) loses fewer steps."
                )
            fix["advice"].append(text)
    ended = ended_text(report, returncode)
    if ended and not any(g.get("exit_origin") for g in report.get("guards", [])):
        fix["advice"].append(f"{ended[0].upper()}{ended[1:]}.")
    return fix


def _scaler_line(s: dict) -> str:
    if s.get("disabled_reason"):
        reason = s["disabled_reason"]
        return f"- `{s['class']}` ({s['framework']}): {_disabled_text(reason)}"
    f = scaler_facts(s)
    heals = "; ".join(f"step {h['step']}: {', '.join(h['paths']) or '(no paths)'}" for h in s.get("heal_records", []))
    return (
        f"- `{s['class']}` ({s['framework']}{', model ' + s['model'] if s.get('model') else ''}): "
        + _scaler_counts(f, 20)
        + (f"; heals: {heals}" if heals else "")
    )


def to_markdown(
    report: dict,
    fix: dict,
    *,
    command: list[str] | None = None,
    plot: str | None = "scale.png",
    returncode: int | None = None,
) -> str:
    lines = [f"# ampsafe run report (pid {report.get('pid')})", ""]
    if command:
        lines += [f"Command: `{shlex.join(command)}`", ""]
    options = report.get("options") or {}
    if options:
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items() if k not in ("quiet", "report"))
        lines += [f"Options: {shown}", ""]
    lines += ["## What happened", ""]
    scalers = report.get("scalers", [])
    lines += [_scaler_line(s) for s in scalers] or ["- the script created no GradScaler"]
    for g in report.get("guards", []):
        if g.get("total_steps"):
            lines.append(
                f"- FP32 guard ({g['framework']}{', model ' + g['model'] if g.get('model') else ''}): "
                f"{g['total_steps']} optimizer steps outside a scaler, {g['skipped_steps']} skipped "
                f"(non-finite loss or gradients){': steps ' + _cut(g['skipped_at'], 20) if g['skipped_at'] else ''}"
                f"{'; non-finite gradients in ' + _cut(g['offenders'], 5) if g.get('offenders') else ''}"
                f"{'; the last skip restored ' + _cut(g['restored'], 8) if g.get('restored') else ''}"
            )
        if g.get("exit_origin"):
            lines.append(f"- the script stopped itself; {origin_text(g['exit_origin'])}")
    for t in report.get("targets", []):
        if t.get("calls"):
            lines.append(
                f"- targets, {t['where']}: {t['calls']} batches checked, {t['bad_boxes']} bad boxes ({t['policy']})"
                f"{': first ' + t['first'] if t.get('first') else ''}"
            )
    ended = ended_text(report, returncode)
    if ended:
        lines.append(f"- {ended}")
    if plot:
        lines += ["", f"![loss scale]({plot})"]
    lines += ["", "## Make the fix permanent", ""]
    if fix.get("patch"):
        lines += [
            "The scaler healed these modules into FP32 islands during the run (the modules its heal line named). "
            "Island them up front, after building the model and before creating the optimizer, and the next run "
            "needs no heal:",
            "",
            "```python",
            "import ampsafe",
            fix["patch"],
            "```",
            "",
        ]
    if fix.get("hf_keep_in_fp32"):
        lines += [
            "The model is an HF transformers model. In HF's own words (the mechanism behind T5's "
            '`_keep_in_fp32_modules = ["wo"]`), the same modules keep their weights in float32 when HF casts the '
            "rest to float16: `from_pretrained(..., dtype=torch.float16)` reads the list through the model's "
            "`_get_dtype_plan`, so set it on the model class before `from_pretrained` builds one. It decides the "
            "weights' dtype; under autocast, which computes these layers in float16 whatever their weights, the "
            "patch line above is the fix:",
            "",
            "```python",
            fix["hf_keep_in_fp32"],
            "```",
            "",
        ]
    for key, advice in (fix.get("level_islands") or {}).items():
        lines += [advice, "", "```python", fix[key], "```", ""]
    swap = fix.get("swap_neck")
    if swap and swap.get("applicable"):
        lines += [
            "The config's neck has an AMP-safe counterpart (a BatchNorm after each unnormalized conv; upstream "
            "checkpoints load with only the new BatchNorm keys missing):",
            "",
            "```bash",
            swap["command"],
            *([swap["run"]] if swap.get("run") else []),
            "```",
            "",
        ]
    elif swap:
        lines += [f"No neck swap for this config: {swap['reason']}", ""]
    for advice in fix.get("advice", []):
        lines.append(f"- {advice}")
    if not fix.get("problems") and not fix.get("patch") and not fix.get("advice"):
        lines.append("Nothing to change: nothing overflowed, no step was skipped, no bad target, the run ended well.")
    return "\n".join(lines).rstrip() + "\n"


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    drew = False
    for s in report.get("scalers", []):
        steps = s.get("steps") or []
        if not steps:
            continue
        drew = True
        xs = [r[0] for r in steps]
        ax.step(xs, [r[1] for r in steps], where="post", label=f"{s['framework']} loss scale")
        over = [(r[0], r[1]) for r in steps if r[2]]
        if over:
            ax.scatter(*zip(*over), marker="x", color="tab:red", zorder=3, label="overflow (step skipped)")
        floor = [(r[0], r[1]) for r in steps if r[3]]
        if floor:
            ax.scatter(*zip(*floor), marker="v", color="black", zorder=4, label="floor hit")
        for i, h in enumerate(s.get("heal_records", [])):
            ax.axvline(h["step"], color="tab:green", linestyle="--", label="heal" if i == 0 else None)
    if drew:
        ax.set_yscale("log", base=2)
        ax.set_ylabel("loss scale")
    for g in report.get("guards", []):
        if g.get("skipped_at"):
            drew = True
            for i, step in enumerate(g["skipped_at"]):
                ax.axvline(step, color="tab:orange", alpha=0.7, label="FP32 guard: step skipped" if i == 0 else None)
    if not drew:
        ax.text(0.5, 0.5, "no scaled or skipped step to plot", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_title(f"ampsafe run, pid {report.get('pid')}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _headline(fix: dict, report: dict) -> str:
    if fix.get("patch"):
        return f"heals happened; the patch line that makes them permanent: {fix['patch']}"
    if fix.get("advice"):
        return fix["advice"][0]
    if fix.get("problems"):
        return fix["problems"][0]
    if fix.get("swap_neck") and fix["swap_neck"].get("applicable"):
        return f"the neck has a safe counterpart: {fix['swap_neck']['command']}"
    return "nothing to change"


def write_reports(
    reports: list[dict],
    directory: Path,
    *,
    config: Path | None = None,
    command: list[str] | None = None,
    run_args: list[str] | None = None,
    returncode: int | None = None,
) -> list[tuple[Path, str]]:
    """Write report.md / report.json / scale.png per process (``directory/<pid>/`` when several trained);
    returns ``(report.md path, headline)`` for each. ``returncode``: the command's exit status."""
    chosen = [r for r in reports if _active(r)] or reports[:1]
    directory = Path(directory)
    written = []
    for report in chosen:
        folder = directory if len(chosen) == 1 else directory / str(report.get("pid"))
        folder.mkdir(parents=True, exist_ok=True)
        fix = permanent_fix(report, config=config, command=command, run_args=run_args, returncode=returncode)
        plot: str | None = "scale.png"
        try:
            _plot(report, folder / "scale.png")
        except ImportError:
            plot = None  # matplotlib is optional: the report says what the plot would have shown
        md = to_markdown(report, fix, command=command, plot=plot, returncode=returncode)
        (folder / "report.md").write_text(md, encoding="utf-8")
        data = {**report, "fix": fix, "command": command, "returncode": returncode}
        (folder / "report.json").write_text(json.dumps(data, indent=1, default=repr), encoding="utf-8")
        written.append((folder / "report.md", _headline(fix, report)))
    return written
