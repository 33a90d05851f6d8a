"""``ampsafe run`` reads every process's summary before it removes the run's temporary folder: a command may return
before the Python processes it started have ended (torchrun's workers run in sessions of their own; a shell that
starts one in the background). Before, such a process wrote after the folder was gone: "could not write the run
report: [Errno 2] No such file or directory: '.../reports/<pid>.json'", and its summary was lost."""

from __future__ import annotations

import json
import subprocess
import sys

from ampsafe.run.exits import LOADED
from ampsafe.run.options import ENV_REPORT

LATE = "import os, time; time.sleep(2); print('late pid', os.getpid(), flush=True)"


def test_a_process_that_outlives_the_command_still_has_its_summary_read(tmp_path):
    # the shell returns once its background Python has loaded ampsafe (its marker in the reports folder), and the
    # Python ends 2 s later
    wait = f'until ls "${ENV_REPORT}"/*{LOADED} >/dev/null 2>&1; do sleep 0.1; done'
    command = f'{sys.executable} -c "{LATE}" & {wait}; exit 0'
    run = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(tmp_path / "report"), "--", "sh", "-c"]
    done = subprocess.run([*run, command], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    assert "could not write the run report" not in out
    late = next(line for line in done.stdout.splitlines() if line.startswith("late pid")).split()[-1]
    assert json.loads((tmp_path / "report" / "report.json").read_text())["pid"] == int(late)
