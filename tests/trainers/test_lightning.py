"""Lightning's own ``Trainer`` under ``ampsafe run``, in one run of ``train_lightning.py``: ``precision="32"``
NaN batches skipped in automatic and manual optimization; ``precision="16-mixed"`` under ``--emulate-fp16``
trains in float16 with ampsafe's scaler and heals the layer its own training drives past 65504; the report's
patch line applies to the LightningModule the user holds."""

from __future__ import annotations

import pytest
from trainer_helpers import (
    SCRIPTS,
    emulated_run,
    float16_rerun_overflows,
    guard_record,
    needs,
    patch_line,
    scale_after,
    stepped_scaler,
)

needs("lightning")
pytestmark = pytest.mark.slow


def test_fp32_nan_batches_are_skipped_and_16_mixed_under_emulate_fp16_heals_its_own_overflow(tmp_path, monkeypatch):
    report = tmp_path / "rep"
    proc = emulated_run(
        report, "train_lightning.py", ["--runs", "32:automatic:2,32:manual:2,16-mixed:automatic", "--steps", "12"]
    )
    out = proc.stdout
    # precision="32": Lightning passes a closure both ways (manual: do_nothing_closure); each NaN step is checked,
    # skipped and counted by the FP32 guard
    for way in ("automatic", "manual"):
        assert f"script: done (32, {way}), parameters finite: True, buffers finite: True" in out, out
    guard = guard_record(report)
    assert (guard.total_steps, guard.skipped_at) == (24, (2, 14)), guard
    assert "nothing was guarded" not in out
    # precision="16-mixed": Lightning's CUDA float16 path on the CPU, with ampsafe's scaler
    assert "--emulate-fp16 [lightning]: Trainer(precision='16-mixed') on a CPU takes its CUDA float16 path" in (
        proc.stderr
    )
    assert "script: done (16-mixed, automatic), parameters finite: True, buffers finite: True" in out, out
    assert "precision plugin: MixedPrecision(cuda), scaler: ampsafe.auto.GradScaler" in out, out
    assert "forward dtype: float16" in out, out
    # growth.py's head passes 65504 at step 4: skipped down to the floor, healed, the scale restored
    scaler = stepped_scaler(report)
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits) == (12, 6, 1), scaler
    assert scaler.skipped_at == [4, 5, 6, 7, 8, 9], scaler.steps
    (heal,) = scaler.heal_records
    assert heal.step == 9 and "net.head" in heal.paths and scale_after(scaler, 9) == 65536.0, scaler
    line = patch_line((report / "report.md").read_text())
    assert '"net.head"' in line, line  # relative to the LightningModule, not to its inner Sequential
    _apply_to_a_fresh_lightning_module(line, monkeypatch)


def _apply_to_a_fresh_lightning_module(line: str, monkeypatch) -> None:
    """The printed line, as printed, on the LightningModule a user builds: no ConfigError, the head islanded, and
    the same training in float16 runs again without an overflow."""
    import ampsafe

    monkeypatch.syspath_prepend(str(SCRIPTS))
    from lightning_model import Regressor

    model = Regressor(False)
    result = eval(line, {"ampsafe": ampsafe, "model": model})  # noqa: S307 - the report's own line
    assert "net.head" in result.patched and not result.skipped, result
    assert type(model.net.head).__name__.startswith("FP32Island"), type(model.net.head)
    assert float16_rerun_overflows(model.net) == []
