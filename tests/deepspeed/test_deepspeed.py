"""DeepSpeed's three loss-scale implementations, natively and under ``ampsafe run`` with zero edits, 2 gloo ranks.

The workload is :mod:`ds_train` (three Linear layers whose head's float16 output passes 65504 by training, the
issue's measured case), one launch per condition with every mode in it: ``zero0`` (FP16_UnfusedOptimizer),
``zero1`` / ``zero2`` (ZeRO's DynamicLossScaler), ``autocast0`` / ``autocast2`` (``torch_autocast`` float16 with
torch's GradScaler under ZeRO-0 / ZeRO-2).

The float16 gate: DeepSpeed 0.19.8 refuses ``"fp16"`` on CPUs without AVX512-FP16 / AMX-FP16 (``ValueError: Type
fp16 is not supported on your device.``), which is every CPU these tests run on, AVX2-only ones included. The
tests open it (and skip DeepSpeed's 80-second shm C++ build) in :mod:`ds_cpu`, imported by the workload script:
test setup, not ampsafe's (``ampsafe`` never touches the gate), so they pass on an AVX2-only CPU too.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ds_launch import launch_script

from ampsafe.run.records import RunSummary

pytest.importorskip("deepspeed")

FP16_MODES = ("zero0", "zero1", "zero2")
MODES = (*FP16_MODES, "autocast0", "autocast2")
AUTOCAST = {"enabled": True, "dtype": "float16"}  # ds_train's torch_autocast section
AT_MINIMUM = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."

pytestmark = [pytest.mark.slow, pytest.mark.dist]


def _launch(out: Path, modes, steps, *extra: str, ampsafe_run: bool = False) -> subprocess.CompletedProcess:
    """``ds_train.py`` on 2 ranks, under ``ampsafe run`` when asked."""
    prefix = [sys.executable, "-m", "ampsafe.cli", "run", "--report", str(out / "report")] if ampsafe_run else []
    args = (",".join(modes), str(out), "--steps", ",".join(map(str, steps)), *extra)
    return launch_script(out, prefix, "ds_train.py", *args)


def _ranks(out: Path, mode: str) -> list[dict]:
    return [json.loads((out / mode / f"rank{r}.json").read_text()) for r in (0, 1)]


def _skipped(rank: dict) -> list[int]:
    return [s["step"] for s in rank["steps"] if s["skipped"]]


@pytest.fixture(scope="module")
def healed(tmp_path_factory):
    """Under ``ampsafe run``: torch's GradScaler starts at 65536, so the autocast modes reach the floor (1) later."""
    out = tmp_path_factory.mktemp("healed")
    done = _launch(out, MODES, (20, 20, 20, 28, 28), "--save-at", "3", ampsafe_run=True)
    return out, done.stdout + done.stderr


def _printed(healed) -> dict:
    out, _ = healed
    return json.loads(Path(glob.glob(str(out / "report" / "*" / "report.json"))[0]).read_text())["fix"]


# without ampsafe run, in one launch: each mode natively; the printed island line applied from the start, under
# classic fp16 and under the torch_autocast switch the report prints; the explicit ampsafe.deepspeed.wrap
NATIVE = (
    *FP16_MODES,
    "zero2/island",
    "zero1/wrap",
    "zero2/raise",
    "autocast0",
    "autocast2",
    "autocast2/island",
    "autocast2/wrap",
)


@pytest.fixture(scope="module")
def native(tmp_path_factory, healed) -> Path:
    out = tmp_path_factory.mktemp("native")
    line = _printed(healed)["deepspeed_island"]
    paths = json.loads(line[line.index("paths=") + len("paths=") : -1])
    steps = [28 if m == "autocast2/wrap" else 16 for m in NATIVE]  # torch's scale falls from 65536 to the floor
    _launch(out, NATIVE, steps, "--island", json.dumps(paths))
    return out


@pytest.mark.parametrize("mode", ["zero1", "zero2"])
def test_native_zero_1_2_exit_already_at_minimum(native, mode):
    for rank in _ranks(native, mode):
        assert rank["error"] == f"Exception: {AT_MINIMUM}"
        assert len(_skipped(rank)) >= 4 and rank["steps"][-1]["scale"] <= 2.0  # 16 -> 1, then the exit at 1


@pytest.mark.parametrize("mode", ["zero0", "autocast0", "autocast2"])
def test_native_skips_from_the_first_overflow_to_the_end(native, mode):
    ranks = _ranks(native, mode)
    for rank in ranks:
        skipped = _skipped(rank)
        assert rank["error"] is None and skipped, rank
        tail = range(skipped[0] + 3, 16)  # past the first overflows, every step is skipped to the end
        assert set(tail) <= set(skipped), skipped
        scales = [s["scale"] for s in rank["steps"]]
        if mode == "zero0":
            assert scales[-1] == 1.0  # at DeepSpeed's min_loss_scale, silently
        elif mode == "autocast0":
            assert scales[-1] <= scales[0] / 2**6  # torch's scaler: no floor, halving every step
        else:
            assert set(scales) == {65536.0}  # ZeRO skips before torch's scaler hears of the overflow
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


@pytest.mark.parametrize("mode", MODES)
def test_ampsafe_run_heals_names_the_module_on_both_ranks(healed, mode):
    out, _ = healed
    ranks = _ranks(out, mode)
    for rank in ranks:
        assert rank["error"] is None
        assert "head" in rank["islands"]  # the layer whose float16 output passes 65504
        assert rank["finite"]
        heal_at = _skipped(rank)[-1]
        assert heal_at < len(rank["steps"]) - 3  # the steps after the heal go on, unskipped
        assert rank["steps"][-1]["scale"] >= 16.0  # the scale was restored
    assert ranks[0]["islands"] == ranks[1]["islands"]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # rank 0's decision, applied by both


@pytest.mark.parametrize("mode", MODES)
def test_save_and_load_checkpoint_round_trip_resumes(healed, mode):
    out, _ = healed
    for rank in _ranks(out, mode):
        assert rank["resumed_scale"] == rank["saved_scale"]
        assert not _skipped(rank)[-1:] or _skipped(rank)[-1] < len(rank["steps"]) - 3


def test_checkpoints_pickle_deepspeeds_own_loss_scaler(healed):
    """A checkpoint saved under ampsafe loads where ampsafe is absent: the pickled scaler is DeepSpeed's class."""
    import torch

    out, _ = healed
    for path in glob.glob(str(out / "zero2" / "ckpt" / "t" / "*optim_states.pt")):
        state = torch.load(path, weights_only=False)["optimizer_state_dict"]
        assert type(state["loss_scaler"]).__module__ == "deepspeed.runtime.fp16.loss_scaler"


def test_the_heals_and_the_report(healed):
    out, stderr = healed
    reports = [json.loads(Path(p).read_text()) for p in glob.glob(str(out / "report" / "*" / "report.json"))]
    assert len(reports) == 2
    summaries = [RunSummary.from_dict(report) for report in reports]
    # each rank's process: one heal per mode, every one islanding the head (paths relative to the engine: module.head)
    heals = [h for summary in summaries for s in summary.scalers for h in s.heal_records]
    islanded_head = all(any(p.rsplit(".", 1)[-1] == "head" for p in h.paths) for h in heals)
    assert len(heals) == 2 * len(MODES) and islanded_head, heals
    classes = {s.class_name.rsplit(".", 1)[-1] for summary in summaries for s in summary.scalers if s.heals}
    assert "DeepSpeedScale" in classes, classes  # the fp16 modes decide through ampsafe's DeepSpeedScale
    assert AT_MINIMUM not in stderr
    # DeepSpeed's inner optimizer steps are the engine's to check, not unguarded
    assert not any(g.total_steps for summary in summaries for g in summary.guards)
    for report in reports:
        assert report["fix"]["deepspeed_island"].startswith('ampsafe.patch(engine.module, policy="island", paths=[')
        assert report["fix"]["deepspeed_config"] == '"torch_autocast": {"enabled": true, "dtype": "float16"}'


def test_the_printed_fix_applied_from_the_start_trains_without_an_overflow(healed, native):
    """The report's island line on ``engine.module`` right after ``deepspeed.initialize``, under classic fp16 and
    under the config switch it prints (``torch_autocast``, the workload's autocast config): no step skipped."""
    assert json.loads("{" + _printed(healed)["deepspeed_config"] + "}")["torch_autocast"] == AUTOCAST
    for mode in ("zero2-island", "autocast2-island"):
        for rank in _ranks(native, mode):
            assert rank["error"] is None and not _skipped(rank), rank
            assert max(s["amax"] for s in rank["steps"]) > 65504  # the head's output is past float16's range


@pytest.mark.parametrize("mode", ["zero1-wrap", "autocast2-wrap"])
def test_explicit_wrap_heals_as_ampsafe_run_does(native, mode):
    """``ampsafe.deepspeed.wrap(engine)`` in the script: ZeRO's DynamicLossScaler decides through ampsafe, and
    torch_autocast's torch GradScaler is replaced by ampsafe's (told of the steps ZeRO-2 skips before it)."""
    ranks = _ranks(native, mode)
    for rank in ranks:
        assert rank["error"] is None and "head" in rank["islands"] and rank["finite"]
        assert _skipped(rank) and _skipped(rank)[-1] < len(rank["steps"]) - 3
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


def test_explicit_wrap_on_floor_raise_names_the_module_instead_of_deepspeeds_exit(native):
    for rank in _ranks(native, "zero2-raise"):
        assert rank["error"].startswith("LossScaleFloorError: loss scale reached its floor min_scale=1"), rank
        assert "head:linear" in rank["error"] and AT_MINIMUM not in rank["error"]
