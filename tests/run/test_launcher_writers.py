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


SIGTERM_CODE = """
import os, signal, sys, time
from ampsafe.run.exits import write_report_on_sigterm
write_report_on_sigterm(lambda: None)
if sys.argv[1] == "composed":  # as Lightning's _SignalConnector: its own handler, then the one it found
    found = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: (print("bypassing", flush=True), found(signum, frame)))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("still running", flush=True)
"""


def test_the_sigterm_handler_ends_the_process_unless_a_later_handler_took_sigterm_over():
    alone = subprocess.run([sys.executable, "-c", SIGTERM_CODE, "alone"], capture_output=True, text=True, timeout=60)
    assert alone.returncode == -15 and "still running" not in alone.stdout  # as without it: SIGTERM ends it
    composed = subprocess.run(
        [sys.executable, "-c", SIGTERM_CODE, "composed"], capture_output=True, text=True, timeout=60
    )
    assert composed.returncode == 0 and composed.stdout.split() == ["bypassing", "still", "running"], composed.stderr
