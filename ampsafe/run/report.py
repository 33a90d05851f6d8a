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

__all__ = ["write_reports", "permanent_fix", "to_markdown"]


def _active(report: dict) -> bool:
    return bool(
        report.get("scalers")
        or any(g.get("total_steps") for g in report.get("guards", []))
        or any(t.get("calls") for t in report.get("targets", []))
    )


def _healed_paths(report: dict) -> dict[str, list[str]]:
    """framework -> the module paths healed (in heal order, each once)."""
    out: dict[str, list[str]] = {}
    for s in report.get("scalers", []):
        for h in s.get("heal_records", []):
            paths = out.setdefault(s["framework"], [])
            paths += [p for p in h.get("paths", []) if p not in paths]
    return out


def _attr_path(path: str) -> str:
    """``backbone.stages.0.conv`` -> ``model.backbone.stages[0].conv`` (Python that reaches the module)."""
    out = "model"
    for part in path.split(".") if path else []:
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


def permanent_fix(
    report: dict, *, config: Path | None = None, command: list[str] | None = None, run_args: list[str] | None = None
) -> dict:
    """What to change so that the next run needs no healing (data; :func:`to_markdown` words it)."""
    fix: dict = {"patch": None, "paddle_o2": None, "swap_neck": None, "advice": []}
    healed = _healed_paths(report)
    all_paths = [p for paths in healed.values() for p in paths]
    if all_paths:
        fix["patch"] = f'ampsafe.patch(model, policy="island", paths={json.dumps(all_paths)})'
    if healed.get("paddle"):
        layers = ", ".join(_attr_path(p) for p in healed["paddle"])
        fix["paddle_o2"] = (
            "model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level='O2', "
            f"excluded_layers=[{layers}])"
        )
    swap = _swap_neck(config)
    if swap is not None:
        fix["swap_neck"] = swap
        if swap["applicable"] and command:
            cmd = [swap["config"] if a == str(config) else a for a in command]
            swap["run"] = shlex.join(["ampsafe", "run", *(run_args or []), "--", *cmd])  # the same run options
    for g in report.get("guards", []):
        if g.get("skipped_steps"):
            fix["advice"].append(
                f"{g['framework']}: {g['skipped_steps']} optimizer step(s) had a non-finite loss or gradients and "
                f"were skipped (steps {', '.join(map(str, g['skipped_at'][:10]))}"
                f"{', ...' if len(g['skipped_at']) > 10 else ''}). "
                + (
                    "The run stopped at the first one (--watch): its error names the op, module, pass and sample."
                    if (report.get("options") or {}).get("watch")
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
        if s.get("floor_hits") and not s.get("heal_records"):
            fix["advice"].append(
                f"{s['class']}: {s['floor_hits']} floor hits and no heal: run with `--on-floor heal` (the default) "
                "so the offending paths become FP32 islands, then apply the patch line this report gives."
            )
    return fix


def _scaler_line(s: dict) -> str:
    if s.get("disabled_reason"):
        reason = s["disabled_reason"]
        return f"- `{s['class']}` ({s['framework']}): {reason if reason.startswith('disabled') else f'disabled ({reason})'}"
    heals = "; ".join(f"step {h['step']}: {', '.join(h['paths']) or '(no paths)'}" for h in s.get("heal_records", []))
    return (
        f"- `{s['class']}` ({s['framework']}{', model ' + s['model'] if s.get('model') else ''}): "
        f"{s.get('total_steps', 0)} steps, {s.get('overflow_steps', 0)} overflowing, {s.get('skipped_steps', 0)} "
        f"skipped, {s.get('floor_hits', 0)} floor hits, {s.get('heals', 0)} heals{' (' + heals + ')' if heals else ''}, "
        f"final scale {s.get('scale')}"
    )


def to_markdown(report: dict, fix: dict, *, command: list[str] | None = None, plot: str | None = "scale.png") -> str:
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
                f"(non-finite loss or gradients){': steps ' + ', '.join(map(str, g['skipped_at'][:20])) if g['skipped_at'] else ''}"
                f"{'; non-finite gradients in ' + ', '.join(g['offenders'][:5]) if g.get('offenders') else ''}"
            )
    for t in report.get("targets", []):
        if t.get("calls"):
            lines.append(
                f"- targets, {t['where']}: {t['calls']} batches checked, {t['bad_boxes']} bad boxes ({t['policy']})"
                f"{': first ' + t['first'] if t.get('first') else ''}"
            )
    if plot:
        lines += ["", f"![loss scale]({plot})"]
    lines += ["", "## Make the fix permanent", ""]
    nothing = True
    if fix.get("patch"):
        nothing = False
        lines += [
            "The scaler healed these module paths into FP32 islands during the run. Island them up front, after "
            "building the model and before creating the optimizer, and the next run needs no heal:",
            "",
            "```python",
            "import ampsafe",
            fix["patch"],
            "```",
            "",
        ]
    if fix.get("paddle_o2"):
        nothing = False
        lines += [
            "With Paddle O2 (`paddle.amp.decorate(level='O2')`), keep the same layers in float32 instead:",
            "",
            "```python",
            fix["paddle_o2"],
            "```",
            "",
        ]
    swap = fix.get("swap_neck")
    if swap and swap.get("applicable"):
        nothing = False
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
        nothing = False
        lines.append(f"- {advice}")
    if nothing:
        lines.append("Nothing to change: no heal, no skipped step, no bad target.")
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
    if fix.get("swap_neck") and fix["swap_neck"].get("applicable"):
        return f"the neck has a safe counterpart: {fix['swap_neck']['command']}"
    if fix.get("advice"):
        return fix["advice"][0]
    return "nothing to change"


def write_reports(
    reports: list[dict],
    directory: Path,
    *,
    config: Path | None = None,
    command: list[str] | None = None,
    run_args: list[str] | None = None,
) -> list[tuple[Path, str]]:
    """Write report.md / report.json / scale.png per process (``directory/<pid>/`` when several trained);
    returns ``(report.md path, headline)`` for each."""
    chosen = [r for r in reports if _active(r)] or reports[:1]
    directory = Path(directory)
    written = []
    for report in chosen:
        folder = directory if len(chosen) == 1 else directory / str(report.get("pid"))
        folder.mkdir(parents=True, exist_ok=True)
        fix = permanent_fix(report, config=config, command=command, run_args=run_args)
        plot: str | None = "scale.png"
        try:
            _plot(report, folder / "scale.png")
        except ImportError:
            plot = None  # matplotlib is optional: the report says what the plot would have shown
        (folder / "report.md").write_text(to_markdown(report, fix, command=command, plot=plot), encoding="utf-8")
        data = {**report, "fix": fix, "command": command}
        (folder / "report.json").write_text(json.dumps(data, indent=1, default=repr), encoding="utf-8")
        written.append((folder / "report.md", _headline(fix, report)))
    return written
