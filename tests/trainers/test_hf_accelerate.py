"""HF ``Trainer`` and accelerate under ``ampsafe run``: a GPT-2 ``Trainer`` run with a NaN loss keeps finite
parameters (accelerate's ``optimizer.step(None)`` is guarded); ``--emulate-fp16`` makes ``fp16=True`` /
``mixed_precision="fp16"`` train in float16 with ampsafe's scaler on a CPU, which heals a forward overflow, and
the report's patch line applies to the model the script built."""

from __future__ import annotations

import pytest
from trainer_helpers import ampsafe_run, needs, patch_line

needs("accelerate")
pytestmark = pytest.mark.slow


def test_hf_trainer_gpt2_nan_loss_at_step_3_is_skipped_and_parameters_stay_finite():
    needs("transformers")
    proc = ampsafe_run(script="train_hf.py", script_args=["--nan-step", "3", "--steps", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, parameters finite: True, trainer steps: 8, scaler: None" in proc.stdout, proc.stdout
    assert ": 8 optimizer steps, 1 skipped (non-finite loss or gradients) (steps 3)" in proc.stdout, proc.stdout
    assert "nothing was guarded" not in proc.stdout


def test_hf_trainer_fp16_under_emulate_fp16_uses_ampsafes_scaler():
    needs("transformers")
    proc = ampsafe_run(
        "--emulate-fp16", script="train_hf.py", script_args=["--fp16", "--nan-step", "3", "--steps", "6"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--emulate-fp16 [accelerate]: Accelerator(mixed_precision='fp16') on a CPU takes its CUDA float16" in (
        proc.stderr
    )
    assert "script: done, parameters finite: True, trainer steps: 6, scaler: GradScaler" in proc.stdout, proc.stdout
    # the NaN step is the scaler's: skipped and counted by it, not by the FP32 guard
    assert "ampsafe.torch.scaler.GradScaler: 6 steps, 1 skipped" in proc.stdout, proc.stdout


def test_accelerate_fp16_under_emulate_fp16_heals_a_forward_overflow(tmp_path):
    report = tmp_path / "rep"
    proc = ampsafe_run(
        "--emulate-fp16",
        "--min-scale",
        "2048",
        "--report",
        str(report),
        script="train_accelerate.py",
        script_args=["--mixed-precision", "fp16", "--overflow", "--steps", "10"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "parameters finite: True, embed dtype: float16" in out, out  # float16 before the heal islanded it
    assert "scaler: ampsafe.auto.GradScaler, scale: 65536.0" in out, out
    assert "1 heals" in out and "scale restored to 65536.0" in proc.stderr
    line = patch_line((report / "report.md").read_text())
    _apply_to_the_scripts_model(line)


def _apply_to_the_scripts_model(line: str) -> None:
    """The printed line on the model ``train_accelerate.py`` builds (same names): every path patched."""
    import torch

    import ampsafe

    model = torch.nn.Sequential()
    model.add_module("embed", torch.nn.Linear(16, 64))
    model.add_module("norm", torch.nn.LayerNorm(64))
    model.add_module("head", torch.nn.Linear(64, 1))
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "embed" in result.patched and not result.skipped, result
    assert type(model.embed).__name__.startswith("FP32Island")
