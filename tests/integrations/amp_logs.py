"""What the integration tests share: scalars read back from TensorBoard event files (with the ``tensorboard``
package's own reader), and a trainer script run under ``ampsafe run --emulate-fp16`` with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ampsafe.run.records import RunSummary


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] over every event file under ``logdir`` (in file order, then write order)."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    found: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(logdir).rglob("events.out.tfevents.*"))
    assert files, f"no event file under {logdir}"
    for path in files:
        reader = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
        reader.Reload()
        for tag in reader.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in reader.Scalars(tag))
    return found


SAMPLED = (
    "amp/grad_norm_unscaled",
    "amp/min_headroom_bits",
    "amp/headroom_bits/",
    "amp/grad_zero_frac",
    "amp/grad_subnormal_frac",
)


def last(series: dict[str, list[tuple[int, float]]], prefix: str = "", sampled: bool = False) -> dict[str, float]:
    """The last value of each ``prefix + amp/...`` tag, keyed by its ``amp/...`` name; without ``sampled``, not
    the names from ``ampsafe run``'s headroom samples (no scaler holds them: tests/run/test_headroom.py compares
    them with the samples)."""
    out = {tag[len(prefix) :]: values[-1][1] for tag, values in series.items() if tag.startswith(prefix + "amp/")}
    return out if sampled else {k: v for k, v in out.items() if not k.startswith(SAMPLED)}


SCRIPTS = Path(__file__).parent / "scripts"


def run_emulated(tmp_path: Path, script: str, *script_args: str, min_scale: float = 1.0):
    """``ampsafe run --emulate-fp16 -- python scripts/SCRIPT ARGS`` (which must exit 0): its output, the
    ``FIGURES`` JSON line the script prints (the scaler's own figures) and the skipped steps of the run's records
    (its ``report.json``, read through :mod:`ampsafe.run.records`)."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--min-scale", str(min_scale)]
    command += ["--report", str(tmp_path / "rep"), "--", sys.executable, str(SCRIPTS / script), *script_args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.split("FIGURES ", 1)[1].splitlines()[0])
    summary = RunSummary.from_dict(json.loads((tmp_path / "rep" / "report.json").read_text(encoding="utf-8")))
    (scaler,) = [s for s in summary.scalers if s.total_steps]
    assert scaler.skipped_at, scaler.steps
    return proc, figures, scaler.skipped_at


def scaler_figures(figures: dict) -> dict[str, float]:
    """The scaler's own figures a script printed, under the amp/* names."""
    return {f"amp/{name}": figures[key] for name, key in NAMES.items()}


NAMES = {
    "loss_scale": "scale",
    "overflow_steps": "overflow_steps",
    "skipped_steps": "skipped_steps",
    "heals": "heals",
    "floor_hits": "floor_hits",
}


def report_scaler(report_dir: Path) -> dict:
    """The report.json record (``ampsafe run --report DIR``) of the one scaler of the run that stepped."""
    report = json.loads((Path(report_dir) / "report.json").read_text())
    (record,) = [s for s in report["scalers"] if s["total_steps"]]
    return record


def figures_after(record: dict, n: int) -> dict[str, float]:
    """The scaler's figures after its first ``n`` optimizer steps, from a report.json scaler record's own per-step
    records ``(step, scale the step ran with, overflowed, floor hit)`` and heals."""
    steps = record["steps"][:n]
    scale = record["steps"][n][1] if n < len(record["steps"]) else record["scale"]
    return {
        "amp/loss_scale": float(scale),
        "amp/overflow_steps": float(sum(bool(s[2]) for s in steps)),
        "amp/skipped_steps": float(sum(bool(s[2]) for s in steps)),
        "amp/heals": float(sum(h["step"] < n for h in record["heal_records"])),
        "amp/floor_hits": float(sum(bool(s[3]) for s in steps)),
    }


def final_figures(record: dict) -> dict[str, float]:
    """The scaler's own counters at the end of the run (a report.json scaler record)."""
    names = ("overflow_steps", "skipped_steps", "floor_hits", "heals")
    return {"amp/loss_scale": record["scale"], **{f"amp/{name}": float(record[name]) for name in names}}
