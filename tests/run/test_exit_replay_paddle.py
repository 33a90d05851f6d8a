"""The FP32 guard's replay of the last forward at exit, on Paddle: ampsafe's exit callback runs before the
cleanups Paddle registers with ``atexit`` at import (``clear_kernel_factory``, ``clear_device_manager``). Run after
them, the replay died on SIGSEGV in Paddle's first op (PaddleOCR's ``tools/train.py`` under ``--watch``) or said
``could not replay the last forward at exit: TypeError: Value Wrapper is only support None and pir.Value``."""

from __future__ import annotations

import sys

from run_helpers import SCRIPTS, ampsafe_run

SCRIPT = SCRIPTS / "train_paddle_fp32_nan.py"


def test_a_script_that_raises_on_a_nan_loss_gets_its_last_forward_replayed_at_exit(tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPT), "--nan-step", "2", "--raise-on-nan-loss"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "FloatingPointError: loss is nan at step 2" in proc.stderr
    assert "could not replay" not in proc.stderr and "signal" not in proc.stdout + proc.stderr
    assert (
        "the script stopped before optimizer step 2; its last forward, replayed in float32: input at 0:linear, "
        "sample 3" in proc.stderr
    ), proc.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert "kind='input'" in report and "replayed in float32 at exit" in report
