"""mmengine's own ``Runner`` under ``ampsafe run``, in one run of ``train_mmengine.py``: an FP32 NaN batch is
skipped; ``AmpOptimWrapper`` under ``--emulate-fp16`` trains in float16 with ampsafe's scaler on a CPU and heals
the layer its own training drives past 65504; the report's patch line applies to the model the script built."""

from __future__ import annotations

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

needs("mmengine")
pytestmark = pytest.mark.slow


def test_fp32_nan_batch_is_skipped_and_amp_optim_wrapper_under_emulate_fp16_heals_its_own_overflow(tmp_path):
    report = tmp_path / "rep"
    proc = emulated_run(report, "train_mmengine.py", ["--runs", "fp32:2,amp", "--steps", "12"])
    out = proc.stdout
    # FP32 (OptimWrapper): the NaN batch of step 2 skipped by the FP32 guard, parameters finite
    assert "script: done (fp32), parameters finite: True, embed dtype: float32, optim wrapper: OptimWrapper" in out
    guard = guard_record(report)
    assert (guard.total_steps, guard.skipped_at) == (12, (2,)), guard
    # AmpOptimWrapper: its CUDA float16 path on the CPU, with ampsafe's scaler as its loss scaler
    assert "--emulate-fp16 [mmengine]: AmpOptimWrapper on a CPU takes its CUDA float16 path" in proc.stderr
    assert "script: done (amp), parameters finite: True, embed dtype: float16" in out, out
    assert "optim wrapper: AmpOptimWrapper, loss scaler: ampsafe.auto.CudaGradScaler" in out, out
    # growth.py's head passes 65504 at step 4: skipped down to the floor, healed, the scale restored
    scaler = stepped_scaler(report)
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits) == (12, 6, 1), scaler
    assert scaler.skipped_at == [4, 5, 6, 7, 8, 9], scaler.steps
    (heal,) = scaler.heal_records
    assert heal.step == 9 and "net.head" in heal.paths and scale_after(scaler, 9) == 65536.0, scaler
    line = patch_line((report / "report.md").read_text())
    assert '"net.head"' in line, line  # relative to the BaseModel the script built
    _apply(line)


def _apply(line: str) -> None:
    """The printed line on a model holding the script's modules under the same names, then the same training in
    float16 again: no overflow."""
    import torch

    import ampsafe

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.net = load_growth().chain()
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "net.head" in result.patched and not result.skipped, result
    assert type(model.net.head).__name__.startswith("FP32Island")
    assert float16_rerun_overflows(model.net) == []
