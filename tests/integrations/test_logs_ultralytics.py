"""ultralytics with ``add_callbacks(model)``: the ``amp/*`` columns of the trainer's own ``results.csv`` (the row
every logger of it gets each epoch) equal the trainer's scaler's own figures at each epoch end.

The script runs under ``ampsafe run --emulate-fp16``, so ``amp=True`` trains in float16 on this CPU with the
trainer's own scaler (ampsafe's); after its first step it sets the scale to 2**24, where the next float16
gradients overflow (skipped steps, backoffs). ``results.csv`` writes 6 significant digits."""

from __future__ import annotations

import csv

import pytest
from amp_logs import NAMES, run_emulated

pytest.importorskip("ultralytics")
pytestmark = pytest.mark.slow  # one trainer run under ampsafe run in a subprocess (about 30 s alone on 2 cores)


def test_results_csv_holds_the_scaler_s_figures_at_each_epoch(tmp_path):
    proc, figures, skipped = run_emulated(tmp_path, "yolo_amp_results.py", "--scale", str(2**24))
    with open(figures["results"], newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    recorded = figures["epochs"]
    assert len(rows) == len(recorded) == 2 and recorded[-1]["skipped_steps"] >= 1
    for row, own in zip(rows, recorded):
        logged = {f"amp/{name}": float(row[f"amp/{name}"]) for name in NAMES}
        assert logged == {f"amp/{name}": pytest.approx(own[key], rel=1e-5) for name, key in NAMES.items()}, row
    assert skipped and rows[-1]["amp/skipped_steps"] == str(len(skipped))
