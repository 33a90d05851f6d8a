"""Running a trainer script under ``ampsafe run`` in a subprocess, as a user would (shared by tests/trainers)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
SCRATCH = tempfile.mkdtemp(prefix="ampsafe-trainers-")  # the default ./ampsafe-run/ report lands here


def ampsafe_run(*args: str, script: str, script_args=(), timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m ampsafe.cli run ARGS -- python scripts/SCRIPT SCRIPT_ARGS`` with its output captured."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", *args, "--", sys.executable, str(SCRIPTS / script)]
    return subprocess.run([*command, *script_args], capture_output=True, text=True, timeout=timeout, cwd=SCRATCH)


def needs(module: str):
    """The framework, or a skip naming the extra that installs it."""
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install ampsafe[...] extras)")


def patch_line(text: str) -> str:
    """The ``ampsafe.patch(...)`` line of a report."""
    found = re.search(r"ampsafe\.patch\(model, [^\n`]*\)", text)
    assert found, text[-3000:]
    return found.group(0)
