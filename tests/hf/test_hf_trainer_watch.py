"""``ampsafe run --watch`` around 5 steps of HF's ``Trainer`` on each tiny model, in emulated float16.

``--emulate-fp16`` makes ``TrainingArguments(fp16=True)`` take accelerate's CUDA float16 path on the CPU (autocast
and ampsafe's scaler) and ``--watch`` watches the trained model with full hooks (one process per model, so that
the watched model is the one trained): a healthy run must end with 5
optimizer steps and no NonFiniteError (T5 used to stop at step 0 on its discarded ``log(0)``). A gradient
overflow at the starting scale 65536 is a routine backoff (ViT has one at step 0), counted, not raised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ampsafe.run.records import RunSummary

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "train_hf_tiny.py"


CLASSES = {
    "bert": "BertForMaskedLM",
    "gpt2": "GPT2LMHeadModel",
    "t5": "T5ForConditionalGeneration",
    "vit": "ViTForImageClassification",
    "llama": "LlamaForCausalLM",
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_trainer_fp16_steps_under_run_watch_are_clean(name, tmp_path):
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--watch", "--emulate-fp16", "--report", str(tmp_path)]
    command += ["--", sys.executable, str(SCRIPT), "--model", name, "--fp16", "--steps", "5"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"watching {CLASSES[name]} for NaN/Inf" in proc.stderr, proc.stderr[-3000:]
    assert f"script: {name} done, parameters finite: True, trainer steps: 5" in proc.stdout, proc.stdout
    summary = RunSummary.from_dict(json.loads((tmp_path / "report.json").read_text(encoding="utf-8")))
    (scaler,) = [s for s in summary.scalers if s.total_steps]
    assert scaler.class_name.endswith("GradScaler") and scaler.total_steps == 5, scaler
    assert (scaler.floor_hits, scaler.heals, scaler.heal_records) == (0, 0, ()), scaler
    assert "NonFiniteError" not in proc.stderr, proc.stderr[-3000:]
