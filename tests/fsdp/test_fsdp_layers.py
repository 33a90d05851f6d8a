"""FSDP2 sharded per layer (torchtitan's and verl's layout) in pure float16, a user's unmodified script under
``ampsafe run`` on 2 gloo ranks (torchrun): ``scripts/train_layers_fsdp.py``, three ``nn.Linear`` (``first``,
``mid``, ``last``), each and the model ``fully_shard``-ed with ``MixedPrecisionPolicy(param_dtype=torch.float16)``.

Measured before the heal widened FSDP2 units (this tree's parent, 14 steps): the floor at step 8 on both ranks,
and the heal refused ("the path from mid reaches |x| = 1.027e+05 in float32 ... and enters last, whose inputs the
engine casts to float16"), the run ended with LossScaleFloorError. FSDP2 reads a unit's policy at every forward
(``FSDPState._mp_policy`` for the input cast, ``FSDPParam.param_dtype`` for the all-gather, its first all-gather's
buffers dropped), so the heal now gives the units the value passes through a float32 policy, on both ranks alike,
and training goes on; the ``fully_shard`` lines the report prints, in place of the script's own calls of those
units, train with torch's own scaler and no overflow.

A rank stopped by torchrun's SIGTERM (another rank failed first) ended without its exit hooks, and its summary was
lost: ``scripts/train_rank_stops.py``."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LAYERS = SCRIPTS / "train_layers_fsdp.py"
STEPS = 14


def _torchrun(port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ampsafe_run(tmp_path: Path, port: int, script: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(tmp_path / "report"), "--"]
    return subprocess.run(
        [*cmd, *_torchrun(port), str(script), *args], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )


def _reports(tmp_path: Path) -> list[tuple[dict, str]]:
    """(report.json, report.md) of each process that built a scaler."""
    out = []
    for path in sorted((tmp_path / "report").glob("*/report.json")):
        data = json.loads(path.read_text())
        if data["scalers"]:
            out.append((data, (path.parent / "report.md").read_text()))
    return out


def _with_lines(script: str, lines: list[str]) -> str:
    """The user's script with each printed line in place of its own ``fully_shard`` call of that module, with the
    script's ``mesh=`` (as the report's advice says)."""
    for line in lines:
        module = line[len("fully_shard(") : line.index(",")]
        own = re.search(rf"^fully_shard\({re.escape(module)}, .*$", script, flags=re.M)
        assert own is not None, (module, script)
        script = script.replace(own.group(0), line.replace(", mp_policy=", ", mesh=mesh, mp_policy=", 1))
    return script


@pytest.mark.dist
def test_ampsafe_run_widens_the_fsdp2_units_a_value_passes_between_and_prints_their_fully_shard_lines(
    tmp_path, free_port
):
    done = _ampsafe_run(tmp_path, free_port, LAYERS, str(STEPS))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reports = _reports(tmp_path)
    assert len(reports) == 2  # both ranks
    (r0, md0), (r1, md1) = reports
    s0, s1 = r0["scalers"][0], r1["scalers"][0]
    heals = s0["heal_records"]
    assert heals == s1["heal_records"] and len(heals) == 1  # the same heal on both ranks
    assert heals[0]["widened"] == heals[0]["paths"] == ["mid", "last"]  # the units, not islands
    step = heals[0]["step"]
    assert s0["floor_hits"] == 1 and step < STEPS - 3
    for s in (s0, s1):  # training went on: no skipped step after the heal, the scale restored and kept
        assert s["total_steps"] == STEPS and not any(skipped for i, _, skipped, _ in s["steps"] if i > step)
        assert s["scale"] == 4.0
    lines = r0["fix"]["torch_fsdp2"].splitlines()
    assert (
        lines
        == r1["fix"]["torch_fsdp2"].splitlines()
        == [
            "fully_shard(model.mid, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))",
            "fully_shard(model.last, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))",
        ]
    )
    assert r0["fix"]["patch"] is None  # no island line: an island of a unit would not hold what it hands on
    for data, md in reports:
        assert all(line in md for line in lines) and "replaces your script's `fully_shard` call" in md
        assert "--on-floor heal" not in md and "--on-floor heal" not in json.dumps(data)  # it was on
    # the printed lines in place of the script's own calls of those units: torch's scaler, no overflow
    fixed = tmp_path / "train_fixed.py"
    fixed.write_text(_with_lines(LAYERS.read_text(), lines))
    done = subprocess.run(
        [*_torchrun(_port()), str(fixed), str(STEPS)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    logged = re.findall(r"^step (\d+) loss (\S+) scale (\S+)$", done.stdout, flags=re.M)
    assert [int(s) for s, _, _ in logged] == list(range(STEPS))
    assert all(math.isfinite(float(loss)) for _, loss, _ in logged)
    assert {float(scale) for _, _, scale in logged} == {4.0}  # never backed off: nothing overflowed


@pytest.mark.dist
def test_ampsafe_run_keeps_the_report_of_a_rank_torchrun_stops(tmp_path, free_port):
    done = _ampsafe_run(tmp_path, free_port, SCRIPTS / "train_rank_stops.py")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "could not write the run report" not in out
    reports = _reports(tmp_path)
    ended = sorted(r["ended"]["exception"].split(":")[0] for r, _ in reports)
    assert ended == ["RuntimeError", "SIGTERM"], [r["ended"] for r, _ in reports]  # rank 0 failed, rank 1 stopped
    for data, md in reports:  # each rank's summary in the run's summary and its own report
        assert data["scalers"][0]["total_steps"] == 3 and data["ended"]["exception"] in md
        assert f"[torch, pid {data['pid']}]" in done.stdout
        assert f"{data['pid']}/report.md" in done.stdout
