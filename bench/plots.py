"""PNG plots for the accuracy and throughput benchmarks (matplotlib, Agg backend: no display needed).

Every plot shows all seeds of a mode (thin lines) so a reader sees the spread, not only the mean.
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["plot_training", "plot_throughput"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finite_or_nan(values) -> list[float]:
    return [v if isinstance(v, (int, float)) and math.isfinite(v) else float("nan") for v in values]


def plot_training(runs: list[dict], path: Path, title: str, metric: str | None = None) -> Path:
    """Loss and loss scale per step for every run, and ``metric`` (mean and seeds) per mode when given.

    ``runs``: dicts with ``mode``, ``seed``, ``losses``, ``scales`` and, when ``metric`` is set, ``metric``
    (the run's final value, or None when the run failed).
    """
    plt = _pyplot()
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    colours = {m: f"C{i}" for i, m in enumerate(modes)}
    panels = 3 if metric else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.3))
    ax_l, ax_s = axes[0], axes[1]
    for i, r in enumerate(runs):
        label = r["mode"] if all(q["mode"] != r["mode"] for q in runs[:i]) else None
        steps = range(len(r.get("losses", [])))
        ax_l.plot(steps, _finite_or_nan(r.get("losses", [])), color=colours[r["mode"]], lw=1, alpha=0.8, label=label)
        scales = [max(s, 1e-45) for s in _finite_or_nan(r.get("scales", [])) if not math.isnan(s)]
        if scales:
            ax_s.semilogy(range(len(scales)), scales, color=colours[r["mode"]], lw=1, alpha=0.8, label=label)
    ax_l.set(xlabel="step", ylabel="training loss", title="loss (gaps: non-finite)")
    ax_s.set(xlabel="step", ylabel="loss scale (log)", title="loss scale (1 = not scaled)")
    for ax in (ax_l, ax_s):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if metric:
        ax_m = axes[2]
        for x, mode in enumerate(modes):
            values = [r["metric"] for r in runs if r["mode"] == mode and r.get("metric") is not None]
            if values:
                ax_m.bar(x, sum(values) / len(values), color=colours[mode], alpha=0.6)
                ax_m.plot([x] * len(values), values, "k.", ms=6)
        ax_m.set_xticks(range(len(modes)), modes, rotation=20)
        ax_m.set(ylabel=metric, ylim=(0, 1), title=f"{metric} (bar: mean, dots: seeds)")
        ax_m.axhline(0.5, color="grey", ls=":", lw=1)
        ax_m.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput(rows: list[dict], path: Path, title: str) -> Path:
    """Bar chart of images/s per mode; ``rows``: dicts with ``case``, ``mode``, ``images_per_s``."""
    plt = _pyplot()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(cases) * len(modes) / 2), 4.0))
    width = 0.8 / max(len(modes), 1)
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, case in enumerate(cases):
            for r in rows:
                if r["case"] == case and r["mode"] == mode and r.get("images_per_s"):
                    xs.append(i + (j - (len(modes) - 1) / 2) * width)
                    ys.append(r["images_per_s"])
        ax.bar(xs, ys, width=width, label=mode, color=f"C{j}")
    ax.set_xticks(range(len(cases)), cases)
    ax.set(ylabel="images / s (training step)", title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
