"""What ``ampsafe run`` does not heal in HF ``generate`` (:mod:`ampsafe.hosts._generation`) stays the original
error, with a note saying what was measured, and leaves the model as it was: a model no scaler of the run trains,
and a NaN that float32 has too (a NaN weight: the module found stays non-finite as an FP32 island, so the island is
undone). transformers' own ``generate`` with sampling, on ``scripts/tiny_lm.py``'s Qwen3 at float16's edge, under
CPU float16 autocast; one subprocess (the run's patches stay out of the test process)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from trl_helpers import SCRIPTS

pytest.importorskip("transformers", reason="transformers is not installed")

CODE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import tiny_lm
from ampsafe.run.options import RunOptions
from ampsafe.run.session import RunSession
from ampsafe.core.swaps import protection_of

SAMPLING = "probability tensor contains either"

def generate(model):
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.autocast("cpu", dtype=torch.float16):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=4)

def failure(model):
    try:
        generate(model)
    except RuntimeError as exc:
        assert SAMPLING in str(exc), exc
        return " | ".join(getattr(exc, "__notes__", []))
    raise AssertionError("generate sampled")

with RunSession(RunOptions(report=None, quiet=True)) as session:
    model = tiny_lm.model("qwen3", init_range=3.5)
    print("NO SCALER:", failure(model))
    scaler = torch.amp.GradScaler("cpu")  # the run's scaler: it trains every model (no step taken yet)
    model = tiny_lm.model("qwen3", init_range=0.02)
    with torch.no_grad():
        model.lm_head.weight[3, 0] = float("nan")
    print("NAN WEIGHT:", failure(model))
    print("ISLANDS:", [n for n, m in model.named_modules() if protection_of(m)])
    print("HEALS:", len(scaler.stats.heals))
"""


def test_generation_not_healed_keeps_the_error_with_what_was_measured(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CODE, str(SCRIPTS)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["NO SCALER"] == (
        "ampsafe run: the float16 generation of Qwen3ForCausalLM was not healed: no healing scaler of this run "
        "trains this model"
    ), lines
    nan = lines["NAN WEIGHT"]
    assert nan.startswith("ampsafe run: the float16 generation of Qwen3ForCausalLM was not healed: "), nan
    assert "the output of lm_head stays non-finite as an FP32 island (islanded: lm_head)" in nan, nan
    assert lines["ISLANDS"] == "[]" and lines["HEALS"] == "0", lines  # the island it tried is undone
