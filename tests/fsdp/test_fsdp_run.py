"""``ampsafe run`` with zero edits on a user's FSDP2 pure-float16 script (torchrun, 2 gloo ranks): the run heals at
the floor on both ranks and the report prints FSDP2's own fix, one ``fully_shard`` line per healed Linear.

Without ``Backend.sharding.float32_params``, the same run reached the floor at step 8 and refused to heal: its "float32"
replay ran under FSDP2's float16 policy and overflowed like the step (measured on this tree's parent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_regress_fsdp.py"


@pytest.mark.dist
def test_ampsafe_run_heals_fsdp2_pure_float16_and_prints_fully_shard_lines(tmp_path, free_port):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(tmp_path), "--", *torchrun]
    done = subprocess.run(
        [*cmd, str(free_port), str(SCRIPT), "11"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/report.json"))]
    healed = [r for r in reports if any(s["heal_records"] for s in r["scalers"])]
    assert len(healed) == 2, [r["fix"] for r in reports]  # both ranks
    fixes = [r["fix"]["torch_fsdp2"] for r in healed]  # the report's FSDP2 lines, beside its patch line
    assert fixes[0] == fixes[1] and fixes[0]
    assert "fully_shard(model[4], mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))" in fixes[0].splitlines()
    assert fixes[0] in (tmp_path / str(healed[0]["pid"]) / "report.md").read_text()


@pytest.mark.dist
def test_ampsafe_run_does_not_replay_an_fsdp2_forward_at_exit(tmp_path, free_port):
    """At the floor with ``--on-floor raise`` the script stops itself; the exit replay of its last forward used to
    crash inside FSDP2 ("schema_.has_value() INTERNAL ASSERT FAILED": FSDP2's custom ops are gone at exit), and with
    other ranks gone it would wait on their all-gathers. It is not replayed; the floor error names the module."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port"]
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--on-floor", "raise", "--report", str(tmp_path), "--"]
    done = subprocess.run(
        [*cmd, *torchrun, str(free_port), str(SCRIPT), "11"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "LossScaleFloorError" in out, out[-3000:]
    assert "from 4:linear" in out and "in float32 its output reaches" in out  # measured in float32 at the floor
    assert "could not replay" not in out and "INTERNAL ASSERT" not in out
    assert "the last forward was not replayed at exit: every forward of this model is collective" in out
