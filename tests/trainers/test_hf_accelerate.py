"""HF ``Trainer`` and accelerate under ``ampsafe run``: a GPT-2 ``Trainer`` run with a NaN loss keeps finite
parameters (accelerate's ``optimizer.step(None)`` is guarded); ``--emulate-fp16`` makes ``fp16=True`` /
``mixed_precision="fp16"`` train in float16 with ampsafe's scaler on a CPU, which heals the layers the run's own
training drives past 65504, and the report's patch line applies to the model the script built."""

from __future__ import annotations

import re

import pytest
from trainer_helpers import (
    emulated_run,
    float16_rerun_overflows,
    guard_record,
    load_growth,
    needs,
    patch_line,
    scale_after,
    stepped_scaler,
)

needs("accelerate")
pytestmark = pytest.mark.slow


def test_hf_trainer_gpt2_nan_loss_is_skipped_and_fp16_under_emulate_fp16_heals_its_own_overflow(tmp_path):
    needs("transformers")
    report = tmp_path / "rep"
    proc = emulated_run(report, "train_hf.py", ["--runs", "fp32:1e-3:8:3,fp16:2:16"])
    out = proc.stdout
    # FP32: accelerate's optimizer.step(None) is guarded; the NaN loss of step 3 is skipped and counted
    assert "script: done (fp32), parameters finite: True, trainer steps: 8, scaler: None" in out, out
    guard = guard_record(report)
    assert (guard.total_steps, guard.skipped_at) == (8, (3,)), guard
    assert "nothing was guarded" not in out
    # fp16=True: the accelerate integration gives the Trainer its CUDA float16 path with ampsafe's scaler; at lr 2
    # the run's own training overflows float16 (c_proj outputs past 65504): skipped to the floor, healed
    assert "--emulate-fp16 [accelerate]: Accelerator(mixed_precision='fp16') on a CPU takes its CUDA float16" in (
        proc.stderr
    )
    assert "script: done (fp16), parameters finite: True, trainer steps: 16, scaler: GradScaler" in out, out
    scaler = stepped_scaler(report)
    assert scaler.class_name == "ampsafe.torch.scaler.GradScaler" and scaler.total_steps == 16, scaler
    assert scaler.heal_records and all(heal.paths for heal in scaler.heal_records), scaler.heal_records
    assert scale_after(scaler, scaler.heal_records[0].step) == 65536.0, scaler.steps
    line = patch_line((report / "report.md").read_text())
    _apply_to_a_fresh_gpt2(line)


def _apply_to_a_fresh_gpt2(line: str) -> None:
    """The printed line on the ``GPT2LMHeadModel`` a user builds: its paths are relative to it (not to the inner
    ``GPT2Model``), and every one is islanded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import ampsafe

    paths = re.findall(r'"([^"]*)"', line.split("paths=", 1)[1])
    assert paths and all(p == "lm_head" or p.startswith("transformer.") for p in paths), line
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert sorted(result.patched) == sorted(paths) and not result.skipped, result
    for path in paths:
        assert type(model.get_submodule(path)).__name__.startswith("FP32Island"), path


def test_accelerate_fp16_under_emulate_fp16_heals_its_own_overflow_and_the_patch_line_applies(tmp_path):
    report = tmp_path / "rep"
    proc = emulated_run(report, "train_accelerate.py", ["--mixed-precision", "fp16", "--steps", "12"])
    assert "--emulate-fp16 [accelerate]: Accelerator(mixed_precision='fp16') on a CPU takes its CUDA float16" in (
        proc.stderr
    )
    out = proc.stdout
    assert "parameters finite: True, embed dtype: float16" in out, out  # float16 training, as on a GPU
    assert "scaler: ampsafe.auto.GradScaler" in out, out
    # growth.py's head passes 65504 at step 4: skipped down to the floor, healed, the scale restored
    scaler = stepped_scaler(report)
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits) == (12, 6, 1), scaler
    assert scaler.skipped_at == [4, 5, 6, 7, 8, 9], scaler.steps
    (heal,) = scaler.heal_records
    assert heal.step == 9 and heal.paths and scale_after(scaler, 9) == 65536.0, scaler
    line = patch_line((report / "report.md").read_text())
    _apply_to_the_scripts_model(line)


def _apply_to_the_scripts_model(line: str) -> None:
    """The printed line on the model ``train_accelerate.py`` builds: every path patched, and the same training
    in float16 runs again without an overflow."""
    import torch

    import ampsafe

    torch.manual_seed(0)
    model = load_growth().chain()
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "head" in result.patched and not result.skipped, result
    assert type(model.head).__name__.startswith("FP32Island")
    assert float16_rerun_overflows(model) == []
