"""The report never advises an option the run already had: a scaler that hit its floor with ``on_floor="heal"``
and did not heal is told what was measured (the heal's reason, or that none was recorded), never "run with
`--on-floor heal`". Read back from report.md and report.json as ``ampsafe run --report`` writes them."""

from __future__ import annotations

import json

import pytest

from ampsafe.run.records import Ended, Refusal, RunSummary, ScalerRecord
from ampsafe.run.report import write_reports

REASON = (
    "loss scale reached its floor min_scale=1 at step 8 and gradients still overflow. on_floor='heal' could not heal "
    "it: the path from mid reaches |x| = 1.027e+05 in float32 on the replayed batch and enters last, whose inputs "
    "the engine casts to float16."
)


def _scaler(on_floor: str, refusals=()) -> ScalerRecord:
    steps = tuple((i, 4.0 if i < 7 else 1.0, i >= 6, i == 8) for i in range(9))
    return ScalerRecord(
        class_name="ampsafe.torch.scaler.GradScaler",
        framework="torch",
        steps=steps,
        total_steps=9,
        skipped_steps=3,
        overflow_steps=3,
        floor_hits=1,
        on_floor=on_floor,
        refusals=tuple(refusals),
    )


def _written(tmp_path, scaler: ScalerRecord) -> tuple[str, str]:
    ended = Ended(exception="LossScaleFloorError: loss scale reached its floor min_scale=1 at step 8")
    write_reports([RunSummary(pid=7, scalers=(scaler,), ended=ended)], tmp_path, returncode=1)
    return (tmp_path / "report.md").read_text(), (tmp_path / "report.json").read_text()


@pytest.mark.parametrize("refused", [True, False], ids=["heal refused", "no reason recorded"])
def test_a_floor_hit_with_heal_on_is_never_told_to_turn_heal_on(tmp_path, refused):
    refusals = [Refusal(step=8, reason=REASON)] if refused else []
    md, raw = _written(tmp_path, _scaler("heal", refusals))
    advice = json.loads(raw)["fix"]["advice"]
    assert "--on-floor heal" not in md and "--on-floor heal" not in raw
    said = "healed nothing at step 8: the path from mid reaches" if refused else "neither a heal nor the reason"
    assert any(said in a for a in advice) and said in md


def test_a_floor_hit_with_heal_off_is_told_to_turn_heal_on(tmp_path):
    md, raw = _written(tmp_path, _scaler("raise"))
    assert "`--on-floor heal`" in md and any("`--on-floor heal`" in a for a in json.loads(raw)["fix"]["advice"])
