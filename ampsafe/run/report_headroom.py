"""The report's headroom part: ``headroom.png`` (each tracked module's float16 headroom against steps, beside the
loss scale) and the early warning's lines in ``report.md``, from the summary's :class:`~ampsafe.run.records.Headroom`.

Apart from :mod:`ampsafe.run.report` so that the report reads the same without samples; matplotlib only to draw.
"""

from __future__ import annotations

import math
from pathlib import Path

from .headroom_trend import bits
from .records import RunSummary

__all__ = ["sampled", "headroom_lines", "plot_headroom", "PLOT"]

PLOT = "headroom.png"


def sampled(report: RunSummary) -> list:
    """The scalers whose headroom was sampled (at least one sample)."""
    return [s for s in report.scalers if s.headroom is not None and s.headroom.samples]


def headroom_lines(report: RunSummary, plot: str | None) -> list[str]:
    """``## Float16 headroom``: the warning (or that none fired) and the plot, per sampled scaler; [] without."""
    lines: list[str] = []
    for s in sampled(report):
        h = s.headroom
        if not lines:
            lines += ["## Float16 headroom", ""]
        how = "the paths `ampsafe scan` found" if h.paths == "scan" else h.paths
        lines.append(
            f"{s.framework}: {h.samples} sampled steps (every {h.every}, every step of the first {h.every} and while "
            f"a crossing was near), {h.tracked} modules tracked ({how})."
        )
        if h.alert is not None:
            lines += ["", f"**Early warning at step {h.alert.step}:** {h.alert.message}"]
            first = next((r[0] for r in s.steps if r[2]), None)
            if first is not None:
                lines.append(f"The first overflow came at step {first}.")
        else:
            lines += ["", "No module's trend projected a crossing of 65504 within the warning's horizon."]
        lines.append("")
    if lines and plot:
        lines += [f"![float16 headroom]({plot})", ""]
    return lines


def plot_headroom(report: RunSummary, path: Path) -> bool:
    """Draw ``path``: headroom (bits) per tracked module against steps above the loss scale; False when nothing
    was sampled (no file)."""
    scalers = sampled(report)
    if not scalers:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=100, sharex=True, height_ratios=[2, 1])
    for s in scalers:
        h = s.headroom
        for name, points in h.series.items():
            xs = [p[0] for p in points]
            ys = [bits(p[1]) for p in points]
            ys = [-0.5 if y is None else (None if math.isinf(y) else y) for y in ys]  # non-finite: below 0
            top.plot(xs, ys, marker=".", label=name or "<root>")
        if h.alert is not None:
            top.axvline(h.alert.step, color="tab:red", linestyle=":", label=f"warning ({h.alert.module})")
        if s.steps:
            bottom.step(
                [r[0] for r in s.steps], [r[1] for r in s.steps], where="post", label=f"{s.framework} loss scale"
            )
            over = [(r[0], r[1]) for r in s.steps if r[2]]
            if over:
                bottom.scatter(*zip(*over), marker="x", color="tab:red", zorder=3, label="overflow")
    top.axhline(0, color="black", linewidth=0.8)
    top.set_ylabel("float16 headroom (bits)")
    top.set_title(f"ampsafe run, pid {report.pid}: log2(65504 / amax) per module (below 0: non-finite)")
    top.legend(loc="best", fontsize=7)
    bottom.set_yscale("log", base=2)
    bottom.set_ylabel("loss scale")
    bottom.set_xlabel("step")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
