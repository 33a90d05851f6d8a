"""The run's records are the run's: a trainer that loads its GradScaler's state mid-run (a checkpoint reload)
keeps the run's step counters, and the reload is reported as an event."""

from __future__ import annotations

from trainer_helpers import ampsafe_run


def test_scaler_reload_keeps_the_runs_counters_and_is_an_event():
    proc = ampsafe_run(script="scaler_reload.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 9 steps, every third one overflowing: the reload after step 5 (back to step 1's state) resets no counter
    assert "script: done, total_steps 9, skipped 3" in proc.stdout, proc.stdout
    assert "GradScaler: 9 steps, 3 skipped" in proc.stdout, proc.stdout
    assert "loaded its GradScaler's state (a checkpoint reload) after step 5: scale 256.0 -> 1024.0" in proc.stderr
