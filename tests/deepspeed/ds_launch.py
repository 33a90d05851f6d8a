"""Launching a test script of this folder on 2 ranks (torchrun on loopback), under ``ampsafe run`` or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def launch_script(out: Path, prefix: list, script: str, *args: str) -> subprocess.CompletedProcess:
    """``prefix`` (``ampsafe run ... --`` or nothing) then ``script`` on 2 ranks (torchrun on loopback)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    command = [*prefix, *(["--"] if prefix else []), *command, str(HERE / script), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=480, cwd=out, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
