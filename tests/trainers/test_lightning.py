"""Lightning's own ``Trainer`` under ``ampsafe run``: FP32 NaN batches skipped in automatic and manual
optimization; ``precision="16-mixed"`` under ``--emulate-fp16`` trains in float16 with ampsafe's scaler and heals
a forward overflow; the report's patch line applies to the LightningModule the user holds."""

from __future__ import annotations

import pytest
from trainer_helpers import SCRIPTS, ampsafe_run, needs, patch_line

needs("lightning")
pytestmark = pytest.mark.slow


def test_precision_32_nan_batch_is_skipped_in_automatic_and_manual_optimization():
    proc = ampsafe_run(
        script="train_lightning.py",
        script_args=["--precision", "32", "--nan-step", "2", "--steps", "5", "--optimization", "automatic,manual"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for way in ("automatic", "manual"):
        assert f"script: done ({way}), parameters finite: True, buffers finite: True" in proc.stdout, proc.stdout
    # Lightning passes a closure in both (manual: do_nothing_closure): each NaN step checked, skipped, counted
    assert "5 optimizer steps" not in proc.stdout
    assert ": 10 optimizer steps, 2 skipped (non-finite loss or gradients) (steps 2, 7)" in proc.stdout, proc.stdout
    assert "nothing was guarded" not in proc.stdout


def test_16_mixed_under_emulate_fp16_trains_float16_with_ampsafes_scaler_and_heals(tmp_path, monkeypatch):
    report = tmp_path / "rep"
    proc = ampsafe_run(
        "--emulate-fp16",
        "--min-scale",
        "2048",
        "--report",
        str(report),
        script="train_lightning.py",
        script_args=["--precision", "16-mixed", "--overflow", "--steps", "10"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--emulate-fp16 [lightning]: Trainer(precision='16-mixed') on a CPU takes its CUDA float16 path" in (
        proc.stderr
    )
    out = proc.stdout
    assert "parameters finite: True, buffers finite: True, forward dtype: float16" in out, out
    assert "precision plugin: MixedPrecision(cuda), scaler: ampsafe.auto.GradScaler" in out, out
    assert "1 heals" in out and "ampsafe heal at step" in proc.stderr and "scale restored to 65536.0" in proc.stderr
    line = patch_line((report / "report.md").read_text())
    assert '"net.embed"' in line, line  # relative to the LightningModule, not to its inner Sequential
    _apply_to_a_fresh_lightning_module(line, monkeypatch)


def _apply_to_a_fresh_lightning_module(line: str, monkeypatch) -> None:
    """The printed line, as printed, on the LightningModule a user builds: no ConfigError, the embed islanded."""
    import ampsafe

    monkeypatch.syspath_prepend(str(SCRIPTS))
    from lightning_model import Regressor

    model = Regressor(False)
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "net.embed" in result.patched and not result.skipped, result
    assert type(model.net.embed).__name__.startswith("FP32Island"), type(model.net.embed)
