"""Running a trainer script under ``ampsafe run`` in a subprocess, as a user would (shared by tests/trainers)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ampsafe.run.records import GuardRecord, RunSummary, ScalerRecord

SCRIPTS = Path(__file__).parent / "scripts"
# the runs' working directory: the default ./ampsafe-run/ report lands here; removed when the test process ends
_SCRATCH = tempfile.TemporaryDirectory(prefix="ampsafe-trainers-")
SCRATCH = _SCRATCH.name


def load_growth():
    """``scripts/growth.py``, the shared recipe whose own training overflows float16 (imported by path)."""
    spec = importlib.util.spec_from_file_location("growth", SCRIPTS / "growth.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ampsafe_run(*args: str, script: str, script_args=(), timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m ampsafe.cli run ARGS -- python scripts/SCRIPT SCRIPT_ARGS`` with its output captured."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", *args, "--", sys.executable, str(SCRIPTS / script)]
    return subprocess.run([*command, *script_args], capture_output=True, text=True, timeout=timeout, cwd=SCRATCH)


def emulated_run(report: Path, script: str, script_args=(), *, min_scale: int = 2048) -> subprocess.CompletedProcess:
    """``ampsafe run --emulate-fp16 --min-scale MIN_SCALE --report REPORT -- python scripts/SCRIPT ...``, which must
    exit 0: a trainer's own float16 path on this CPU, its overflow healed above a floor of ``min_scale``."""
    args = ("--emulate-fp16", "--min-scale", str(min_scale), "--report", str(report))
    proc = ampsafe_run(*args, script=script, script_args=script_args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def stepped_scaler(report: Path) -> ScalerRecord:
    """The record of the one scaler of the run that stepped, from the run's ``report.json`` (``--report REPORT``)
    read through :mod:`ampsafe.run.records`: what happened, typed, never parsed from the run's log lines."""
    summary = RunSummary.from_dict(json.loads((Path(report) / "report.json").read_text(encoding="utf-8")))
    stepped = [s for s in summary.scalers if s.total_steps]
    assert len(stepped) == 1, summary.scalers
    return stepped[0]


def guard_record(report: Path) -> GuardRecord:
    """The record of the run's one FP32 guard that saw optimizer steps, from the run's ``report.json``."""
    summary = RunSummary.from_dict(json.loads((Path(report) / "report.json").read_text(encoding="utf-8")))
    guards = [g for g in summary.guards if g.total_steps]
    assert len(guards) == 1, summary.guards
    return guards[0]


def scale_after(record: ScalerRecord, step: int) -> float:
    """The loss scale the step after ``step`` ran with (the record's own per-step rows)."""
    return next(float(row[1]) for row in record.steps if row[0] == step + 1)


def needs(module: str):
    """The framework, or a skip naming the extra that installs it."""
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install ampsafe[...] extras)")


def patch_line(text: str) -> str:
    """The ``ampsafe.patch(...)`` line of a report."""
    found = re.search(r"ampsafe\.patch\(model, [^\n`]*\)", text)
    assert found, text[-3000:]
    return found.group(0)


def float16_rerun_overflows(net, steps: int = 12) -> list[int]:
    """The steps at which ``net`` (a ``growth.chain()``, patched or not) overflows when ``growth.py``'s recipe
    trains it again in float16: CPU autocast and torch's own scaler, in this process, without ``ampsafe run``."""
    import torch

    growth = load_growth()
    torch.manual_seed(0)
    optimizer = growth.optimizer(net.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    x, y = growth.data(steps)
    overflowed = []
    for step in range(steps):
        batch = slice(growth.BATCH * step, growth.BATCH * (step + 1))
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x[batch])
        if not bool(torch.isfinite(out).all()):
            overflowed.append(step)
        optimizer.zero_grad()
        scaler.scale(growth.loss(out, y[batch])).backward()
        scaler.step(optimizer)
        scaler.update()
    return overflowed
