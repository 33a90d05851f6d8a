"""HF ``Trainer(deepspeed=cfg)`` on the t5 brink under ``ampsafe run``, 2 gloo ranks (its own file: ``make test``
runs files on separate workers, and this one launch takes about 100 s). The float16 gate is opened by the test
script's :mod:`ds_cpu`, as in :mod:`test_deepspeed`."""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pytest
from ds_launch import launch_script

from ampsafe.run.records import RunSummary

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.dist]


def test_hf_trainer_deepspeed_t5_brink_heals_under_ampsafe_run(tmp_path):
    """HF ``Trainer(deepspeed={... "torch_autocast" ...})`` on the t5 brink, unmodified (:mod:`hf_t5_trainer`):
    ``deepspeed.initialize`` runs inside HF / accelerate, the brink's ``wo`` overflows from the first step, ZeRO-2
    skips the steps before torch's scaler hears of them, and under ``ampsafe run`` (floor 16384, so the floor
    comes after two backoffs) both ranks island the decoder's last feed-forward and the run goes on."""
    pytest.importorskip("transformers")
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--min-scale", "16384", "--report", str(tmp_path / "r")]
    launch_script(tmp_path, command, "hf_t5_trainer.py", str(tmp_path), "--steps", "5", "--autocast")
    reports = glob.glob(str(tmp_path / "r" / "*" / "report.json"))
    summaries = [RunSummary.from_dict(json.loads(Path(p).read_text())) for p in reports]
    assert len(summaries) == 2, reports  # one report per rank's process
    for summary in summaries:  # each rank's scaler healed, islanding the decoder's last feed-forward
        heals = [h for s in summary.scalers for h in s.heal_records]
        assert heals and any(p.endswith("DenseReluDense.wo") for h in heals for p in h.paths), summary.scalers
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["error"] is None and rank["trainer_steps"] == 5 and rank["finite"]
        assert "decoder.block.1.layer.2.DenseReluDense.wo" in rank["islands"]
        assert rank["skipped"] < 5  # steps after the heal went through
    assert ranks[0]["islands"] == ranks[1]["islands"] and ranks[0]["checksum"] == ranks[1]["checksum"]
