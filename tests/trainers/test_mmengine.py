"""mmengine's own ``Runner`` under ``ampsafe run``: an FP32 NaN batch is skipped; ``AmpOptimWrapper`` under
``--emulate-fp16`` trains in float16 with ampsafe's scaler on a CPU and heals a forward overflow; the report's
patch line applies to the model the script built."""

from __future__ import annotations

import pytest
from trainer_helpers import ampsafe_run, needs, patch_line

needs("mmengine")
pytestmark = pytest.mark.slow


def test_fp32_nan_batch_is_skipped_and_parameters_stay_finite():
    proc = ampsafe_run(script="train_mmengine.py", script_args=["--nan-step", "2", "--steps", "5"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done, parameters finite: True" in proc.stdout, proc.stdout
    assert "FP32 guard on Regressor: 5 optimizer steps, 1 skipped (non-finite loss or gradients) (steps 2)" in (
        proc.stdout
    )


def test_amp_optim_wrapper_under_emulate_fp16_heals_and_its_patch_line_applies(tmp_path):
    report = tmp_path / "rep"
    proc = ampsafe_run(
        "--emulate-fp16",
        "--min-scale",
        "2048",
        "--report",
        str(report),
        script="train_mmengine.py",
        script_args=["--amp", "--overflow", "--steps", "10"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--emulate-fp16 [mmengine]: AmpOptimWrapper on a CPU takes its CUDA float16 path" in proc.stderr
    out = proc.stdout
    assert "parameters finite: True, embed dtype: float16" in out, out
    assert "optim wrapper: AmpOptimWrapper, loss scaler: ampsafe.auto.CudaGradScaler" in out, out
    assert "1 heals" in out and "scale restored to 65536.0" in proc.stderr
    line = patch_line((report / "report.md").read_text())
    assert '"net.embed"' in line, line  # relative to the BaseModel the script built
    _apply(line)


def _apply(line: str) -> None:
    import torch

    import ampsafe

    model = torch.nn.Module()  # the script's Regressor holds the same modules under the same names
    model.net = torch.nn.Sequential()
    model.net.add_module("embed", torch.nn.Linear(16, 64))
    model.net.add_module("norm", torch.nn.LayerNorm(64))
    model.net.add_module("head", torch.nn.Linear(64, 1))
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "net.embed" in result.patched and not result.skipped, result
    assert type(model.net.embed).__name__.startswith("FP32Island")
