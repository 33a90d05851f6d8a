"""The report's gradient-underflow part: ``## Gradient underflow`` in ``report.md`` (each scaler's and each
no-scaler guard's samples), and the lines that add a loss scaler to a float16 loop that has none.

Apart from :mod:`ampsafe.run.report` so that the report reads the same without samples; reads only the summary's
records (:class:`~ampsafe.run.records.UnderflowRecord`, :class:`~ampsafe.run.records.NoScaler`).
"""

from __future__ import annotations

from .records import AddScaler, GuardRecord, NoScaler, RunSummary, StaticScale, UnderflowRecord

__all__ = ["underflow_lines", "no_scaler_advice", "add_scaler_code", "static_scale_lines", "static_scale_advice"]


def _fractions(u: UnderflowRecord) -> str:
    step, scale, zero, subnormal = u.latest
    return (
        f"at step {step} (scale {scale:g}), {zero:.2%} of {u.elements:,} gradient elements were zero in float16 and "
        f"{subnormal:.2%} subnormal (below 2^-14: precision lost)"
    )


def _series_lines(who: str, u: UnderflowRecord) -> list[str]:
    if u.latest is None:
        return [f"{who}: no sample{' (' + u.note + ')' if u.note else ''}.", ""]
    zeros = [r[2] for r in u.series]
    lines = [
        f"{who}: {u.samples} sampled steps; {_fractions(u)}; zero fraction over the samples "
        f"{min(zeros):.2%}-{max(zeros):.2%}."
    ]
    if u.modules:
        worst = ", ".join(f"`{m or '<root>'}` {z:.1%} zero / {s:.1%} subnormal" for m, (z, s) in u.modules.items())
        lines.append(f"Most affected modules: {worst}.")
    if u.lost_below:
        lost = ", ".join(f"{scale:g}: {frac:.1%}" for scale, frac in u.lost_below)
        lines.append(
            "Of the elements non-zero at the latest sample, a lower scale would flush to zero (parameter gradients; "
            f"a lower bound): {lost}."
        )
    if u.note:
        lines.append(u.note)
    return [*lines, ""]


def add_scaler_code(lines: AddScaler) -> list[str]:
    """The lines that add the scaler, as a code block's lines (each with where it goes)."""
    return [
        f"{lines.create}  # after the optimizer is built",
        f"{lines.backward}  # in place of {lines.replaces_backward}",
        f"{lines.step}  # in place of {lines.replaces_step}",
        f"{lines.update}  # right after {lines.step}",
    ]


def _no_scaler(g: GuardRecord) -> NoScaler | None:
    return g.no_scaler if g.no_scaler is not None and g.no_scaler.step is not None else None


def underflow_lines(report: RunSummary) -> list[str]:
    """``## Gradient underflow``: per sampled scaler and per guard of float16 steps without a scaler (the lines
    that add one, in the framework's words); [] when nothing was sampled or seen."""
    lines: list[str] = static_scale_lines(report)
    for s in report.scalers:
        if s.underflow is not None and (s.underflow.samples or s.underflow.note):
            lines += _series_lines(f"{s.framework} scaler (read before each unscale)", s.underflow)
    for g in report.guards:
        n = _no_scaler(g)
        if n is None:
            continue
        nonfinite = (
            f"{len(n.nonfinite_steps)} of its {n.steps} steps had a non-finite loss or gradient and were skipped by "
            "the FP32 guard (without it they would have reached the weights)"
            if n.nonfinite_steps
            else f"none of its {n.steps} steps had a non-finite loss or gradient"
        )
        lines += [
            f"**{g.framework}: a float16 backward with no loss scaler** ({n.why}), from step {n.step}: gradients "
            f"below 6e-8 flush to zero and nothing skips an overflowing step; {nonfinite}.",
            "",
        ]
        if n.underflow is not None:
            lines += _series_lines(f"{g.framework}, scale 1 (no scaler)", n.underflow)
        if n.lines is not None and n.lines.create:
            lines += ["Add a loss scaler:", "", "```python", *add_scaler_code(n.lines), "```", ""]
            if n.lines.note:
                lines += [f"({n.lines.note}.)", ""]
    return ["## Gradient underflow", "", *lines] if lines else []


def no_scaler_advice(report: RunSummary) -> list[str]:
    """One sentence per guard of float16 steps without a scaler: the fix's advice."""
    out = []
    for g in report.guards:
        n = _no_scaler(g)
        if n is None:
            continue
        u = n.underflow.latest if n.underflow is not None else None
        measured = f" ({u[2]:.1%} of the gradient elements were zero in float16 at step {u[0]})" if u else ""
        code = (
            "; ".join(f"`{line}`" for line in (n.lines.create, n.lines.backward, n.lines.step, n.lines.update))
            if n.lines is not None and n.lines.create
            else ""
        )
        out.append(
            f"{g.framework}: the optimizer steps ran a float16 backward with no loss scaler ({n.why}, from step "
            f"{n.step}){measured}: add one" + (f": {code}" if code else "") + " (see Gradient underflow)."
        )
    return out


def _built(t: StaticScale) -> str:
    return f"GradScaler({', '.join(f'{k}={v}' for k, v in t.kwargs.items())})" if t.kwargs else "GradScaler"


def _measured(t: StaticScale) -> str:
    if t.step is None:
        return f"nothing measured ({t.note})" if t.note else "nothing measured"
    return (
        f"at step {t.step}, {t.zero:.2%} of {t.elements:,} gradient elements were zero in float16 (an upper bound "
        f"on what it flushed: a zero of float32 counts too) and {t.subnormal:.2%} subnormal (below 2^-14)"
    )


def static_scale_lines(report: RunSummary) -> list[str]:
    """Per scaler built with a fixed loss scale of 1: what it is, what was measured, and the fix ampsafe chose
    from the measurement, in the trainer's words (config keys and command-line overrides) and the framework's."""
    lines: list[str] = []
    for s in report.scalers:
        t = s.static_scale
        if t is None:
            continue
        by = f"by {t.trainer} " if t.trainer else ""
        lines += [
            f"**{s.framework} scaler: {t.words}** (built {by}as {_built(t)}): a step with an inf is still skipped, but "
            f"the scale never moves, so a gradient below float16's smallest subnormal flushes to zero; "
            f"{_measured(t)}. ampsafe kept the scaler as built (training unchanged).",
            "",
        ]
        if t.chosen_scale is None:
            continue
        lines += [
            f"Use dynamic loss scaling from {t.chosen_scale:g}, the lowest power of two at which at most 1% of the "
            f"measured non-zero gradient elements stay below 2^-14 ({t.subnormal_at_chosen:.2%} there; the dynamic "
            "scaler moves on from it):",
            "",
        ]
        if t.overrides:
            where = f" ({t.overrides_note})" if t.overrides_note else ""
            lines += [f"On the {t.trainer or 'training'} command line{where}:", "", "```bash", t.overrides, "```", ""]
        if t.config:
            lines += [f"or in the {t.trainer or 'training'} config:", "", "```yaml", *_yaml(t.config), "```", ""]
        if t.code:
            lines += ["or in code:" if t.trainer else "In code:", "", "```python", t.code, "```", ""]
    return lines


def _yaml(config) -> list[str]:
    """``Global.scale_loss: 32`` keys as nested YAML lines, grouped under their sections."""
    out, section = [], None
    for key, value in config.items():
        head, _, name = key.rpartition(".")
        if head != section:
            out.append(f"{head}:")
            section = head
        out.append(f"  {name}: {value}")
    return out


def static_scale_advice(report: RunSummary) -> list[str]:
    """One sentence per scaler built with a fixed loss scale of 1: the fix's advice."""
    out = []
    for s in report.scalers:
        t = s.static_scale
        if t is None:
            continue
        fix = f"`{t.overrides}`" if t.overrides else f"`{t.code}`" if t.code else "dynamic loss scaling"
        measured = (
            f" ({t.zero:.1%} of the gradient elements zero in float16 at step {t.step})" if t.step is not None else ""
        )
        out.append(f"{s.framework} scaler: {t.words}{measured}: use {fix} (see Gradient underflow).")
    return out
