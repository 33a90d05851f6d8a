"""``ampsafe run --emulate-fp16`` on a PaddleOCR-shaped O2 loop whose float16 overflow is not a conv/matmul
path but DBNet's step-function ``exp`` (on the float16 black list at O1 only): the replays run in the step's
emulated O2 (the script's ``auto_cast`` block has closed by then) and name ``head:exp``, whose inf dies inside
the head (the loss finite); heal islands the module whose forward runs it within 3 steps of the first overflow,
before the floor (``--on-floor raise`` waits for the floor and names it there)."""

from __future__ import annotations

import json
import re
import sys

from run_helpers import SCRIPTS, ampsafe_run

from ampsafe.run.records import RunSummary

SCRIPT = SCRIPTS / "train_paddle_step_function.py"


def _steps(out: str) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in re.findall(r"script: step (\d+) loss [\d.]+ scale ([\d.]+)", out)]


def test_O2_exp_overflow_heals_by_islanding_the_head_and_training_goes_on(tmp_path):
    proc = ampsafe_run("--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, str(SCRIPT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    heal = re.search(
        r"ampsafe heal at step (\d+): islanded 1 module\(s\) \(head\) for the path\(s\) starting at "
        r"(head \(risky [^)]*\))",
        proc.stderr,
    )
    assert heal is not None, proc.stderr[-3000:]
    assert "exp" in heal.group(2)
    healed_at = int(heal.group(1))
    steps = _steps(proc.stdout)
    assert len(steps) == 8 and healed_at < 7
    # restored to the starting scale, and no step after the heal overflowed (the scale never backs off again)
    assert [scale for step, scale in steps if step >= healed_at] == [8.0] * (8 - healed_at)
    assert re.search(r"GradScaler: 8 steps, \d+ skipped, 0 floor hits, 1 heals, final scale 8\.0", proc.stdout)
    (scaler,) = RunSummary.from_dict(json.loads((tmp_path / "report.json").read_text())).scalers
    (heal,) = scaler.heal_records
    assert scaler.skipped_at[0] == 0 and heal.step <= 3 and heal.paths == ("head",), (heal, scaler.skipped_at)
    report = (tmp_path / "report.md").read_text()
    # the log line, report.json and both patch lines name the same module
    assert 'ampsafe.patch(model, policy="island", paths=["head"])' in report
    assert 'ampsafe.patch(model, policy="island", level="O2", paths=["head"])' in report


def test_O2_exp_overflow_with_on_floor_raise_names_the_forward_and_the_op():
    proc = ampsafe_run("--emulate-fp16", "--on-floor", "raise", "--report", "", "--", sys.executable, str(SCRIPT))
    assert proc.returncode != 0
    assert "LossScaleFloorError" in proc.stderr
    assert "overflows in the forward pass: the first non-finite value comes from head:exp" in proc.stderr
    assert "head's output stays within |x| <= " in proc.stderr  # the bounded map: the overflow is inside the head


def test_O1_runs_exp_in_float32_and_never_overflows():
    proc = ampsafe_run("--emulate-fp16", "--report", "", "--", sys.executable, str(SCRIPT), "--level", "O1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [scale for _, scale in _steps(proc.stdout)] == [8.0] * 8
    assert "ampsafe heal" not in proc.stderr


def test_O2_watch_names_the_sentinels_own_error_not_the_frameworks_wrapper(tmp_path):
    # Paddle re-raises an error raised inside an op as `OSError: (External) ...`: summary and report quote the
    # sentinel's NonFiniteError, naming the wrapper after it
    proc = ampsafe_run("--watch", "--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, str(SCRIPT))
    assert proc.returncode == 1, proc.stderr[-3000:]
    ended = "the run ended with `NonFiniteError: first non-finite value of the forward pass comes from head:exp"
    assert ended in proc.stdout and "(re-raised as OSError)`" in proc.stdout, proc.stdout[-3000:]
    assert "ended with `OSError" not in proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert (
        "The run ended with `NonFiniteError: first non-finite value of the forward pass comes from head:exp" in report
    )
