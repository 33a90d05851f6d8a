"""``ampsafe run`` with zero edits on a user's FSDP2 pure-float16 script (torchrun, 2 gloo ranks): the run heals at
the floor on both ranks and the report prints FSDP2's own fix, one ``fully_shard`` line per healed Linear.

Before ``Backend.float32_params``, the same run reached the floor at step 8 and refused to heal: its "float32"
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
    fixes = [r["fix"]["engine_fix"] for r in healed]
    assert fixes[0] == fixes[1] and fixes[0]
    assert "fully_shard(model[4], mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))" in fixes[0]
    assert fixes[0][0] in (tmp_path / str(healed[0]["pid"]) / "report.md").read_text()
