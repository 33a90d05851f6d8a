"""PaddleOCR's own, unmodified ``tools/train.py`` under ``ampsafe run --emulate-fp16`` logs ``amp/*`` through its
own ``TrainingStats``: the train log line it prints each step, and ``log_metrics(train_stats.get(), "TRAIN",
step)`` of its logger list (W&B where configured). Read back from PaddleOCR's own log lines, they equal the
scaler's own per-step figures in the run's ``report.json``.

This PaddleOCR tree has no VisualDL logger any more (``use_visualdl`` only warns that it was removed) and W&B
is not installed here, so no logger of its list can be read back offline: the log line is read, which PaddleOCR
builds from the same ``train_stats.get()`` its loggers get. The recipe is ``test_ppocr_det_train.py``'s at O2,
where DBHead's ``exp`` overflows on every step from step 0: the scale halves until the heal islands the head and
puts the scale back to 1024, so every series moves.
"""

from __future__ import annotations

import re

import pytest
from amp_logs import NAMES, figures_after

from bench.ppocr_optin import BATCH

pytestmark = pytest.mark.slow

STEPS = 6
_LINE = re.compile(r"global_step: (\d+), (.*)")
_PAIR = re.compile(r"(amp/\w+): ([-+0-9.eEnaif]+)")


def _logged(log: str) -> dict[int, dict[str, float]]:
    """global step -> the values of PaddleOCR's train log line at that step, of the amp/* figures the scaler
    itself counts (``amp_logs.NAMES``: report.json has their per-step records)."""
    out = {}
    for line in log.splitlines():
        found = _LINE.search(line)
        if found:
            pairs = _PAIR.findall(found.group(2))
            out[int(found.group(1))] = {k: float(v) for k, v in pairs if k[len("amp/") :] in NAMES}
    return out


def test_ppocr_train_log_and_logger_stats_carry_the_scaler_s_figures(paddleocr_src, tmp_path):
    from bench.ppocr_optin import run_one, write_dataset

    write_dataset(tmp_path / "data", count=(STEPS + 1) * BATCH, size=160)
    # the test shim stops the run inside the step after STEPS, before that step's log line
    r = run_one(paddleocr_src, tmp_path, "ampsafe", "O2", data=tmp_path / "data", stop_after=STEPS + 1)
    assert r["returncode"] == 0 and r["steps"] == STEPS + 1, r["log_tail"]
    log = (tmp_path / f"ampsafe-O2-{STEPS + 1}" / "log.txt").read_text()
    assert "amp/* metrics added to ppocr's training stats" in log
    (record,) = [s for s in r["report"]["scalers"] if s["total_steps"]]
    logged = _logged(log)
    assert sorted(logged) == list(range(1, STEPS + 1)), sorted(logged)
    assert logged == {n: figures_after(record, n) for n in range(1, STEPS + 1)}
    scales = [logged[n]["amp/loss_scale"] for n in sorted(logged)]
    assert min(scales) < 1024.0 and logged[STEPS]["amp/skipped_steps"] >= 2, logged  # halved until the heal
    assert logged[STEPS]["amp/loss_scale"] == 1024.0, logged  # the heal put the scale back
