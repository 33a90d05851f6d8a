"""DeepSpeed ZeRO-3 (parameters partitioned across the ranks, gathered module by module for each forward), with
``"fp16"`` and with ``torch_autocast`` float16, 2 gloo ranks on a CPU: natively, under ``ampsafe run`` with zero
edits, and with ``ampsafe.deepspeed.wrap``. The workload is :mod:`ds_train` (its head's float16 output passes
65504 by training), the CPU setup :mod:`ds_cpu`, as in ``test_deepspeed.py``.

Measured (deepspeed 0.19.8, torch 2.14, this CPU): ZeRO-3 runs on gloo. Natively ``"fp16"`` exits with "Current
loss scale already at minimum" at step 10 (steps 7-10 skipped) and ``torch_autocast`` skips at 65536 from step 6
to the end (21 of 28). Under ampsafe both heal at the floor (steps 11 and 23): ``head`` and ``mid`` become FP32
islands on both ranks, computing in float32 inside the module on the float16 parameters ZeRO-3 gathered for it,
and training goes on at the restored scale. A ZeRO-3 all-gather that gloo's worker thread still held when the
interpreter finalized aborted the process ("terminate called without an active exception"): ``ds_train.drain``
waits them out before the script ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ds_launch import launch_script

pytest.importorskip("deepspeed")

AT_MINIMUM = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
pytestmark = [pytest.mark.slow, pytest.mark.dist]


def _launch(out: Path, modes, steps, *extra: str, ampsafe_run: bool = False) -> None:
    prefix = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(out / "report")] if ampsafe_run else []
    launch_script(out, prefix, "ds_train.py", ",".join(modes), str(out), "--steps", ",".join(map(str, steps)), *extra)


def _ranks(out: Path, mode: str) -> list[dict]:
    return [json.loads((out / mode / f"rank{r}.json").read_text()) for r in (0, 1)]


def _skipped(rank: dict) -> list[int]:
    return [s["step"] for s in rank["steps"] if s["skipped"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """(native and ``wrap`` runs, ``ampsafe run`` runs); each mode with a save_checkpoint / load_checkpoint round
    trip 3 steps before its end."""
    native, healed = tmp_path_factory.mktemp("native"), tmp_path_factory.mktemp("healed")
    # fp16 engines first: after a torch_autocast engine, DeepSpeed builds the next "fp16" one with torch_autocast on
    _launch(native, ("zero3", "zero3/wrap", "autocast3", "autocast3/wrap"), (20, 20, 28, 28), "--save-at", "3")
    _launch(healed, ("zero3", "autocast3"), (20, 28), "--save-at", "3", ampsafe_run=True)
    return native, healed


def test_native_zero3_exits_already_at_minimum_and_autocast3_skips_to_the_end(runs):
    native, _ = runs
    for rank in _ranks(native, "zero3"):
        assert rank["error"] == f"Exception: {AT_MINIMUM}"
        assert len(_skipped(rank)) >= 4 and rank["steps"][-1]["scale"] <= 2.0
    ranks = _ranks(native, "autocast3")
    for rank in ranks:
        skipped = _skipped(rank)
        assert rank["error"] is None and set(range(skipped[0] + 3, 28)) <= set(skipped)
        assert {s["scale"] for s in rank["steps"]} == {65536.0}  # ZeRO skips before torch's scaler hears of it
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


@pytest.mark.parametrize(
    "where, mode",
    [("healed", "zero3"), ("healed", "autocast3"), ("native", "zero3-wrap"), ("native", "autocast3-wrap")],
)
def test_zero3_heals_names_the_module_on_both_ranks_and_resumes_a_checkpoint(runs, where, mode):
    out = dict(zip(("native", "healed"), runs))[where]
    ranks = _ranks(out, mode)
    for rank in ranks:
        assert rank["error"] is None and rank["finite"]
        assert "head" in rank["islands"]  # named through the engine's module, whose parameters ZeRO-3 partitions
        heal_at = _skipped(rank)[-1]
        assert heal_at < len(rank["steps"]) - 3 and rank["steps"][-1]["scale"] >= 16.0
        assert rank["resumed_scale"] == rank["saved_scale"]
    assert ranks[0]["islands"] == ranks[1]["islands"]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
