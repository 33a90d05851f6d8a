"""Running the TRL scripts (``scripts/``, which import nothing of ampsafe) as a user would: under ``ampsafe run
--emulate-fp16`` or natively (``native.py``: torch's own GradScaler, float16 emulated on this CPU), in a
subprocess; their records read back typed: report.json (ampsafe's), TRL's own ``trainer_state.json`` log history
(what the Trainer's loggers got), and the native scaler's updates."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from ampsafe.run.records import RunSummary, ScalerRecord

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"


def edge_args(model: str) -> tuple[str, ...]:
    """The script arguments of ``model`` at float16's edge (``scripts/tiny_lm.py``'s ``EDGE_ARGS``)."""
    return ("--model", model, *_tiny_lm().EDGE_ARGS[model])


def grown_args(model: str) -> tuple[str, ...]:
    """The script arguments of ``model`` at which SFT grows a float16 overflow (``scripts/tiny_lm.py``'s
    ``GROWN_ARGS``)."""
    return ("--model", model, *_tiny_lm().GROWN_ARGS[model])


def _tiny_lm():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import tiny_lm

    return tiny_lm


def _launch(ranks: int, port: int | None) -> list[str]:
    if ranks == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(port)]


def run_ampsafe(
    work: Path, script: str, *args: str, ranks: int = 1, port: int | None = None, options=(), ok: bool = True
) -> str:
    """``ampsafe run --emulate-fp16 OPTIONS --report WORK/rep -- python scripts/SCRIPT --out WORK/out ARGS`` (under
    ``torch.distributed.run`` with ``ranks`` > 1), which must exit 0 when ``ok``, else must fail; its output."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", *options, "--report", str(work / "rep")]
    command += ["--", *_launch(ranks, port), str(SCRIPTS / script), "--out", str(work / "out"), *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=work)
    assert (proc.returncode == 0) == ok, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def run_summaries(work: Path) -> list[RunSummary]:
    """Each process's report.json, read through :mod:`ampsafe.run.records` (typed, never parsed from log lines)."""
    paths = sorted((work / "rep").rglob("report.json"))
    return [RunSummary.from_dict(json.loads(p.read_text(encoding="utf-8"))) for p in paths]


def run_native(work: Path, script: str, *args: str, ok: bool = True) -> tuple[list[tuple[float, float]], str]:
    """``python native.py --scales ... scripts/SCRIPT --out WORK/out ARGS``, which must exit 0 when ``ok``, else
    must fail: (the (scale before, scale after) of each of torch's ``GradScaler.update`` calls, its output)."""
    work.mkdir(exist_ok=True)
    scales = work / "scales-{rank}.json"
    command = [sys.executable, str(HERE / "native.py"), "--scales", str(scales), str(SCRIPTS / script)]
    proc = subprocess.run(
        [*command, "--out", str(work / "out"), *args], capture_output=True, text=True, timeout=300, cwd=work
    )
    assert (proc.returncode == 0) == ok, proc.stdout[-2000:] + proc.stderr[-3000:]
    updates = [tuple(pair) for pair in json.loads((work / "scales-0.json").read_text())]
    return updates, proc.stdout + proc.stderr


def scaler_records(work: Path) -> list[ScalerRecord]:
    """The records of the scalers that stepped, one per process."""
    return [s for summary in run_summaries(work) for s in summary.scalers if s.total_steps]


def history(work: Path) -> list[dict]:
    """TRL's own log history (``trainer.save_state()``): the entries of training steps, as its loggers got them."""
    state = json.loads((work / "out" / "trainer_state.json").read_text(encoding="utf-8"))
    return [entry for entry in state["log_history"] if "loss" in entry]


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def figures_after(record: ScalerRecord, n: int) -> dict[str, float]:
    """The scaler's own figures after its first ``n`` optimizer steps, from its record's per-step rows ``(step,
    scale the step ran with, overflowed, floor hit)`` and heals: what ``amp/*`` must say at step n."""
    steps = record.steps[:n]
    scale = record.steps[n][1] if n < len(record.steps) else record.scale
    return {
        "amp/loss_scale": float(scale),
        "amp/overflow_steps": float(sum(bool(s[2]) for s in steps)),
        "amp/skipped_steps": float(sum(bool(s[2]) for s in steps)),
        "amp/heals": float(sum(h.step < n for h in record.heal_records)),
        "amp/floor_hits": float(sum(bool(s[3]) for s in steps)),
    }


FIGURES = ("amp/loss_scale", "amp/overflow_steps", "amp/skipped_steps", "amp/heals", "amp/floor_hits")


def logged_figures(entry: dict) -> dict[str, float]:
    """The scaler's figures among one log-history entry's keys."""
    return {key: entry[key] for key in FIGURES}
