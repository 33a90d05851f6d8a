"""HF ``Trainer`` with ``callbacks=[AmpCallback()]``: the ``amp/*`` keys reach TensorBoard (read back from the
event file ``report_to=["tensorboard"]`` wrote) and equal the Trainer's scaler's own figures.

The script runs under ``ampsafe run --emulate-fp16``, so ``fp16=True`` trains in float16 on this CPU with the
scaler accelerate builds (ampsafe's); at lr 2 the model's own training overflows float16 (skipped steps, a
floor hit, a heal). The script's other user callback adds ``user/marker`` in its ``on_log`` the usual way: that
key never reaches TensorBoard (HF runs user callbacks after its reporting ones), the amp keys do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tb_events import last, scalars

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("tensorboard")

SCRIPT = Path(__file__).parent / "scripts" / "hf_amp_tensorboard.py"
STEPS = 12


def test_amp_keys_reach_tensorboard_ahead_of_the_reporting_callback_and_equal_the_scaler(tmp_path):
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--min-scale", "2048"]
    command += ["--report", str(tmp_path / "rep"), "--", sys.executable, str(SCRIPT)]
    command += ["--out", str(tmp_path / "out"), "--steps", str(STEPS)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.split("FIGURES ", 1)[1].splitlines()[0])
    assert figures["ampsafe_scaler"]  # accelerate's scaler, made ampsafe's by ampsafe run
    # the callback moved itself just ahead of TensorBoardCallback; the user's own callback stays behind it
    order = figures["callbacks"]
    assert order.index("AmpCallback") + 1 == order.index("TensorBoardCallback") < order.index("UserMarker"), order

    series = scalars(tmp_path / "out")
    assert "train/user/marker" not in series  # the pitfall: a key added in a user's on_log is never written
    logged = last(series, prefix="train/")
    assert logged == {
        "amp/loss_scale": figures["scale"],
        "amp/overflow_steps": figures["overflow_steps"],
        "amp/skipped_steps": figures["skipped_steps"],
        "amp/heals": figures["heals"],
        "amp/floor_hits": figures["floor_hits"],
    }
    assert figures["total_steps"] == STEPS and figures["heals"] >= 1 and figures["skipped_steps"] >= 2

    # every training log, step by step: the skipped count after s optimizer steps, from ampsafe run's own summary
    summary = re.search(r"\(skipped steps ([\d, ]+)\)", proc.stdout)
    assert summary, proc.stdout[-3000:]
    skipped = [int(s) for s in summary.group(1).split(", ")]
    per_step = dict(series["train/amp/skipped_steps"][:STEPS])
    assert per_step == {s: float(sum(k < s for k in skipped)) for s in range(1, STEPS + 1)}
    # and trainer.state.log_history keeps what the loggers got
    trained = [entry for entry in figures["log_history"] if "loss" in entry]
    assert [entry["amp/skipped_steps"] for entry in trained] == [per_step[entry["step"]] for entry in trained]
