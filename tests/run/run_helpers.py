"""Running a script under ``ampsafe run`` in a subprocess, as a user would (shared by the tests/run files)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ampsafe.run.records import GuardRecord, RunSummary, ScalerRecord

SCRIPTS = Path(__file__).parent / "scripts"
# the runs' working directory, so that the default ./ampsafe-run/ report lands there and not in the checkout;
# removed when the test process ends
_SCRATCH = tempfile.TemporaryDirectory(prefix="ampsafe-run-tests-")
SCRATCH = _SCRATCH.name


def ampsafe_run(
    *args: str, cwd: Path | str | None = None, timeout: int = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m ampsafe.cli run ARGS`` with its output captured (``env``: the command's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or SCRATCH,
        env=env,
    )


def run_summary(report: Path | str) -> RunSummary:
    """The run's typed record, read from ``report.json`` (``ampsafe run --report REPORT``) through
    :mod:`ampsafe.run.records`: what happened, never parsed from the run's log or summary lines."""
    return RunSummary.from_dict(json.loads((Path(report) / "report.json").read_text(encoding="utf-8")))


def stepped_scaler(report: Path | str) -> ScalerRecord:
    """The record of the one scaler of the run that stepped."""
    stepped = [s for s in run_summary(report).scalers if s.total_steps]
    assert len(stepped) == 1, stepped
    return stepped[0]


def only_scaler(report: Path | str) -> ScalerRecord:
    """The record of the run's one scaler, whether it stepped or not (a disabled one did not)."""
    (scaler,) = run_summary(report).scalers
    return scaler


def guard_record(report: Path | str) -> GuardRecord:
    """The record of the run's one FP32 guard that saw optimizer steps."""
    guards = [g for g in run_summary(report).guards if g.total_steps]
    assert len(guards) == 1, run_summary(report).guards
    return guards[0]
