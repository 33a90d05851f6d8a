"""``ampsafe run`` tells the truth and loses nothing: the report reads the summary's records, a skipped FP32 step
puts back everything its forward moved, ``--watch`` under a dynamic loss scale stops only on what the scaler
cannot absorb, and the report's O2 fix line, run, gives 0 overflows (a script that stops itself on a NaN loss:
tests/run/test_torchvision_reference.py, on torchvision's own engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from run_helpers import SCRIPTS, ampsafe_run, run_summary, stepped_scaler  # tests/run/run_helpers.py

from ampsafe.run.report import format_summary, permanent_fix, to_markdown


def _scaler_record(steps: list[tuple[int, float, bool, bool]], **extra) -> dict:
    return {
        "class": "ampsafe.torch.scaler.GradScaler",
        "framework": "torch",
        "total_steps": len(steps),
        "overflow_steps": sum(r[2] for r in steps),
        "skipped_steps": sum(r[2] for r in steps),
        "floor_hits": sum(r[3] for r in steps),
        "heals": 0,
        "heal_records": [],
        "scale": steps[-1][1] / (2 if steps[-1][2] else 1),
        "steps": steps,
        **extra,
    }


def test_skipped_scaler_steps_are_listed_and_never_nothing_to_change():
    steps = [(i, 65536.0 / 2**i, True, False) for i in range(5)] + [(5, 2048.0, False, False)]
    report = {"pid": 7, "scalers": [_scaler_record(steps)], "guards": [], "targets": []}
    summary = format_summary([report])
    assert (
        "GradScaler: 6 steps, 5 skipped, 0 floor hits, 0 heals, final scale 2048.0; 5 overflowing "
        "(skipped steps 0, 1, 2, 3, 4)"
    ) in summary
    fix = permanent_fix(report)
    markdown = to_markdown(report, fix, plot=None)
    assert "Nothing to change" not in markdown
    assert "5 of 6 steps overflowed and were skipped (steps 0, 1, 2, 3, 4)" in markdown
    assert "the scale went from 65536 to 2048" in markdown
    # a long list is cut with "…", in the summary as in the report
    many = [(i, 8.0, True, False) for i in range(30)]
    assert "(skipped steps 0, 1, 2, 3, 4, 5, 6, 7, …)" in format_summary(
        [{"pid": 1, "scalers": [_scaler_record(many)]}]
    )


def test_a_failed_run_is_never_nothing_to_change():
    report = {"pid": 3, "scalers": [], "guards": [], "targets": [], "ended": {"exception": "RuntimeError: boom"}}
    markdown = to_markdown(report, permanent_fix(report), plot=None)
    assert "Nothing to change" not in markdown and "`RuntimeError: boom`" in markdown
    clean = {"pid": 3, "scalers": [], "guards": [], "targets": [], "ended": None}
    assert "Nothing to change" in to_markdown(clean, permanent_fix(clean, returncode=0), plot=None)
    assert "exited with status 2" in to_markdown(clean, permanent_fix(clean, returncode=2), plot=None, returncode=2)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_fp32_skip_restores_every_parameter_and_buffer_the_nan_image_touched(framework, tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path / "report"), "--", sys.executable, str(SCRIPTS / "train_bn_nan.py"),
        "--framework", framework, "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = np.load(tmp_path / "before.npz"), np.load(tmp_path / "after.npz")
    assert set(before.files) == set(after.files) and len(before.files) >= 7  # parameters, running stats (, count)
    for name in before.files:
        assert np.isfinite(after[name]).all(), name
        assert np.array_equal(after[name], before[name]), name
    # torch's count of batches seen is state the skip puts back too, and says so
    stats = (
        ("1.running_mean", "1.running_var", "1.num_batches_tracked")
        if framework == "torch"
        else ("1._mean", "1._variance")
    )
    line = next(line for line in proc.stderr.splitlines() if "step 2: non-finite loss" in line)
    assert "restored: " + ", ".join(stats) in line  # the skip line says what was put back
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    (guard,) = [g for g in data["guards"] if g["total_steps"]]
    assert guard["skipped_at"] == [2] and guard["restored"] == list(stats)


@pytest.mark.slow
def test_watch_under_a_dynamic_scale_counts_routine_backoffs_and_exits_0(tmp_path):
    config = tmp_path / "train.yml"
    config.write_text("Global:\n  init_loss_scaling: 1048576.0\n")  # the emulated float16 backward overflows
    proc = ampsafe_run(
        "--emulate-fp16", "--watch", "--report", str(tmp_path / "report"), "--", sys.executable,
        str(SCRIPTS / "train_paddle.py"), "-c", str(config), "--steps", "8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (scaler,) = run_summary(tmp_path / "report").scalers
    # every overflowing step was a routine backoff --watch counted, the first two steps among them
    assert len(scaler.watch_backoffs) == scaler.overflow_steps >= 2, scaler
    assert scaler.skipped_at[:2] == [0, 1] and scaler.watch_backoffs[0].step == 0, scaler  # step 0 is watched
    assert "ran in float32" not in proc.stderr  # the watch's lines name the emulated float16 ops as such
    assert "Nothing to change" not in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.slow
def test_watch_stops_on_a_forward_overflow_naming_it(tmp_path):
    proc = ampsafe_run(
        "--watch", "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_fp16_overflow.py")
    )
    assert proc.returncode == 1
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.NonFiniteError"))
    assert "forward pass comes from embed:linear (ran in float16) at step 0" in error and "kind='overflow'" in error
    assert "the run ended with `NonFiniteError: first non-finite value of the forward pass" in proc.stdout
    assert "Nothing to change" not in (tmp_path / "report.md").read_text()


_STOPS_ITSELF = """\
import math, sys
import torch


def main():  # the model is a local, freed while SystemExit unwinds (as in torchvision's reference)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 4)
        if step == 1:
            x[2] = float("nan")
        loss = model(x).pow(2).mean()
        if not math.isfinite(loss.item()):
            print(f"Loss is {loss.item()}, stopping training")
            sys.exit(1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


main()
"""


def test_a_script_that_exits_on_a_nan_loss_with_its_model_a_local_gets_the_sample_named(tmp_path):
    script = tmp_path / "stops_itself.py"
    script.write_text(_STOPS_ITSELF)
    proc = ampsafe_run("--report", str(tmp_path / "report"), "--", sys.executable, str(script))
    assert proc.returncode == 1 and "Loss is nan, stopping training" in proc.stdout, proc.stderr[-3000:]
    assert re.search(r"the script stopped itself; forward pass of step 1: \S+, sample 2 .*kind='input'", proc.stdout)
    assert "bad data: sample 2 of the batch of step 1" in proc.stdout
    origin = json.loads((tmp_path / "report" / "report.json").read_text())["guards"][0]["exit_origin"]
    assert (origin["kind"], origin["sample"], origin["step"]) == ("input", 2, 1)


@pytest.mark.slow
def test_the_reports_O2_fix_line_run_on_the_O2_loop_gives_0_overflows(tmp_path):
    script = str(SCRIPTS / "train_paddle_step_function.py")
    proc = ampsafe_run("--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fix = json.loads((tmp_path / "report.json").read_text())["fix"]
    assert fix["paddle_o2"] == 'ampsafe.patch(model, policy="island", level="O2", paths=["head"])'
    fixed = ampsafe_run(
        "--emulate-fp16", "--on-floor", "raise", "--report", str(tmp_path / "fixed"), "--", sys.executable, script,
        "--after-decorate", f"import ampsafe; {fix['paddle_o2']}",
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    scaler = stepped_scaler(tmp_path / "fixed")
    assert (scaler.total_steps, scaler.skipped_steps, scaler.overflow_steps) == (8, 0, 0), scaler
    assert (scaler.floor_hits, scaler.heals, scaler.scale) == (0, 0, 8.0), scaler


def test_watch_numbers_passes_by_training_steps_not_eval_forwards():
    import torch

    import ampsafe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with ampsafe.watch(model, on_nonfinite="record") as w:
        model(torch.randn(3, 4)).sum().backward()  # training step 0
        model.eval()
        model(torch.randn(3, 4))  # evaluation forwards: eval(), no_grad, inference_mode
        model.train()
        with torch.no_grad():
            model(torch.randn(3, 4))
        with torch.inference_mode():
            model(torch.randn(3, 4))
        x = torch.randn(3, 4)
        x[2, 0] = float("nan")
        model(x)  # training step 1
    (event,) = w.events
    assert "at step 1 in sample 2" in str(event) and event.kind == "input"


def test_watch_leaves_the_scalers_scale_and_a_wrapper_put_on_it_alone():
    code = (
        "import ampsafe.auto as auto\n"
        "auto.install(watch=True, quiet=True)\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "s = torch.amp.GradScaler('cpu')\n"
        "assert 'scale' not in vars(s), 'ampsafe replaced scale on the instance'\n"
        "calls = []\n"
        "inner = s.scale\n"
        "def wrapper(loss):\n"
        "    calls.append(1)\n"
        "    return inner(loss)\n"
        "s.scale = wrapper  # a library's wrapper\n"
        "for _ in range(3):\n"
        "    s.scale(model(torch.randn(2, 4)).sum()).backward()\n"
        "    s.step(opt)\n"
        "    s.update()\n"
        "    opt.zero_grad()\n"
        "assert s.scale is wrapper and len(calls) == 3, (s.scale, calls)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
