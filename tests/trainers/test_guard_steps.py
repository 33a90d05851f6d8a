"""The FP32 guard sees every calling form of an optimizer step: ``step()``, ``step(None)`` (accelerate's), a
closure (positional or keyword: Lightning's), and LBFGS, whose closure is re-evaluated inside its step. The run's
records are the run's: a loop that loads its GradScaler's state mid-run (a checkpoint reload) keeps the run's
counters, the reload is an event, and the counters are not in the scaler's saved state."""

from __future__ import annotations

from trainer_helpers import ampsafe_run, guard_record, stepped_scaler


def test_every_step_form_is_guarded_and_a_scaler_reload_keeps_the_runs_counters(tmp_path):
    # one process: closure_steps.py, then scaler_reload.py
    args = ["--nan-step", "2", "--steps", "5"]
    proc = ampsafe_run("--report", str(tmp_path), script="steps_and_reload.py", script_args=args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for form in ("plain", "none", "closure", "closure-kw"):  # 5 steps, 5 closure calls: none doubled
        assert f"script: form={form} parameters finite: True closure calls: 5 " in out, out
    for form in ("closure", "closure-kw"):  # a skipped closure step returns the closure's (NaN) loss, as a step does
        line = next(line for line in out.splitlines() if f"form={form} " in line)
        assert line.split("returned: ")[1].startswith("[") and ", nan, " in line, line
    lbfgs = next(line for line in out.splitlines() if "form=lbfgs " in line)
    assert "parameters finite: True" in lbfgs  # LBFGS re-evaluates its closure: those calls are its own
    # 5 forms x 5 steps, the NaN step of each skipped
    guard = guard_record(tmp_path)
    assert (guard.total_steps, guard.skipped_at) == (25, (2, 7, 12, 17, 22)), guard
    assert "nothing was guarded" not in out
    # scaler_reload.py: 9 steps, every third one overflowing; the reload after step 5 (back to step 1's state)
    # resets no counter, and the saved state holds no run counters
    assert "script: done, total_steps 9, skipped 3" in out, out
    scaler = stepped_scaler(tmp_path)
    assert (scaler.total_steps, scaler.skipped_steps) == (9, 3), scaler
    (reload,) = scaler.reloads
    assert (reload.after_step, reload.scale_before, reload.scale_after) == (5, 256.0, 1024.0), reload
    keys = next(line for line in out.splitlines() if line.startswith("script: state_dict keys "))
    assert "'scale'" in keys and "stats" not in keys, keys


def test_steps_that_ran_unchecked_are_said_plainly():
    """A notebook that builds its optimizer before ``import ampsafe.auto``: its steps are counted as unchecked,
    never summarised as "nothing was guarded"."""
    import subprocess
    import sys

    from trainer_helpers import SCRIPTS

    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "unchecked_steps.py")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no GradScaler; optimizer steps ran and none was checked by ampsafe" in proc.stdout, proc.stdout
    assert "3 optimizer step(s) ran unchecked" in proc.stdout and "import ampsafe.auto first" in proc.stdout
    assert "nothing was guarded" not in proc.stdout
