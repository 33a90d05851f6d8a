"""Running a script under ``ampsafe run`` in a subprocess, as a user would (shared by the tests/run files)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
# the runs' working directory, so that the default ./ampsafe-run/ report lands there and not in the checkout
SCRATCH = tempfile.mkdtemp(prefix="ampsafe-run-tests-")


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
