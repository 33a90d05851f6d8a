"""The floor never kills a run the framework's own scaler trains: an overflow only the backward has.

The workload (scripts/train_critic.py, scripts/train_critic_paddle.py, knowing nothing about ampsafe) is a PPO-style
critic whose value head's bias gradient sums about 200 per token over 512 tokens: it overflows float16 at any
loss scale of 1 or more while every forward value stays under 1% of 65504. torch's and Paddle's own scalers
train it by backing off below 1 (no floor). Under ``ampsafe run`` (floor 1, ``--on-floor heal``) the step's own
gradients name the module whose gradient went non-finite, and the heal islands it (its backward then runs in
float32): the same run trains, at scale 1, to a loss at least as low. The printed fix line, applied to the
script's model under the framework's own scaler, keeps the scale at 1 or above.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = 30
FORWARD_LIMIT = 0.01 * 65504  # every forward value of the workload stays under 1% of float16's max
NATIVE_PADDLE = (  # Paddle's own GradScaler, its float16 AMP emulated on the CPU and nothing else of ampsafe
    "from ampsafe.paddle import amp_emulation; amp_emulation.install(); import runpy, sys; "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _native(framework: str, out: Path, after: str = "") -> list[dict]:
    script = SCRIPTS / ("train_critic.py" if framework == "torch" else "train_critic_paddle.py")
    args = [str(script), "--out", str(out), "--steps", str(STEPS)] + (["--after", after] if after else [])
    cmd = [sys.executable, *args] if framework == "torch" else [sys.executable, "-c", NATIVE_PADDLE, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _rows(out)


def _ampsafe(framework: str, tmp: Path) -> tuple[list[dict], dict]:
    script = SCRIPTS / ("train_critic.py" if framework == "torch" else "train_critic_paddle.py")
    emulate = ["--emulate-fp16"] if framework == "paddle" else []
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", *emulate, "--report", str(tmp / "report"), "--"]
    cmd += [sys.executable, str(script), "--out", str(tmp / "ampsafe.jsonl"), "--steps", str(STEPS)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return _rows(tmp / "ampsafe.jsonl"), json.loads((tmp / "report" / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_backward_only_overflow_trains_under_ampsafe_as_under_the_frameworks_scaler(framework, tmp_path):
    from ampsafe.run.records import RunSummary

    native = _native(framework, tmp_path / "native.jsonl")
    ours, report = _ampsafe(framework, tmp_path)
    for rows in (native, ours):
        assert all(r["amax"] < FORWARD_LIMIT for r in rows)  # nothing in the forward comes near float16's max
    assert min(r["scale"] for r in native) < 1.0 and all(r["finite"] for r in native)  # below 1: no floor there
    assert native[-1]["loss"] < 0.9 * native[0]["loss"]  # the framework's scaler trains it
    assert all(r["finite"] for r in ours) and min(r["scale"] for r in ours) >= 1.0
    assert ours[-1]["loss"] <= native[-1]["loss"]  # at least as low after the same steps

    (scaler,) = RunSummary.from_dict(report).scalers
    heal = scaler.heal_records[0]
    assert heal.cause == "backward" and heal.paths == ("value_head",)
    floor_hits = [step for step, _scale, _overflow, floor_hit in scaler.steps if floor_hit]
    assert heal.step <= floor_hits[0] + 3  # healed within 3 steps of the first overflow at the floor
    overflowing = [step for step, _scale, overflow, _floor in scaler.steps if overflow]
    named = {o.step: o.module for o in scaler.overflow_origins}
    assert overflowing and all(named.get(step) == "value_head" for step in overflowing if step <= heal.step)
    assert not scaler.refusals and report["returncode"] == 0
    assert report["fix"]["patch"].startswith('ampsafe.patch(model, policy="island", paths=["value_head"')


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_the_printed_island_line_keeps_the_frameworks_own_scaler_at_scale_1_or_above(framework, tmp_path):
    _, report = _ampsafe(framework, tmp_path)
    line = report["fix"]["patch"]
    native = _native(framework, tmp_path / "native.jsonl")
    fixed = _native(framework, tmp_path / "fixed.jsonl", after=f"import ampsafe; {line}")
    assert min(r["scale"] for r in native) < 1.0
    assert min(r["scale"] for r in fixed) >= 1.0 and all(r["finite"] for r in fixed)
    skipped = [sum(a["scale"] > b["scale"] for a, b in zip(rows, rows[1:])) for rows in (native, fixed)]
    assert skipped[1] < skipped[0] and fixed[-1]["loss"] < native[-1]["loss"]


@pytest.mark.dist
def test_two_ranks_name_the_same_module_and_heal_alike(tmp_path, free_port, worker_module):
    import torch
    import torch.multiprocessing as mp

    workers = worker_module("backward_workers")
    mp.spawn(workers.torch_critic_worker, args=(2, free_port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["origins"] and r0["origins"] == r1["origins"]
    assert {module for _step, module, _kind in r0["origins"]} == {"value_head"}
    assert r0["heals"] == r1["heals"] and r0["heals"][0][1:] == (("value_head",), "backward")
    assert r0["below_floor"] == r1["below_floor"] == [] and r0["scale"] == r1["scale"] >= 1.0
    assert all(torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(r0["params"], r1["params"]))
    assert r0["losses"][-1] < r0["losses"][0]


SQRT_NAN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
for step in range(6):
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(torch.randn(4, 8))
    loss = torch.sqrt(out - 100.0).mean()  # sqrt of a negative number: NaN in float32 too, and its gradient
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def test_a_refused_heal_reports_what_was_measured_never_the_option_already_on(tmp_path):
    from ampsafe.run.records import RunSummary

    script = tmp_path / "train_sqrt.py"
    script.write_text(SQRT_NAN)
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(tmp_path / "r"), "--", sys.executable]
    done = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0  # the floor raised: a numerical error no island or scale fixes
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    (scaler,) = RunSummary.from_dict(report).scalers
    assert (
        scaler.on_floor == "heal" and scaler.refusals and "come from elsewhere (the loss" in scaler.refusals[0].reason
    )
    text = (tmp_path / "r" / "report.md").read_text() + json.dumps(report["fix"])
    assert "--on-floor heal` (the default)" not in text and "run with `--on-floor heal`" not in text
    assert "healed nothing" in " ".join(report["fix"]["advice"])
