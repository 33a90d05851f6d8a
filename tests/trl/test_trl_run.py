"""TRL's ``SFTTrainer`` and ``GRPOTrainer`` with ``fp16=True`` under ``ampsafe run``, zero edits to the scripts
(``scripts/``: CPU-size random-init Qwen3, Gemma3, Qwen3-MoE from transformers' own classes), float16 emulated on
this CPU as a GPU runs it.

The edge workload (``scripts/tiny_lm.py``'s ``EDGE_ARGS``, TRL's default learning rates): an ``initializer_range``
that puts the MLP's output (``down_proj``; the MoE's eager experts) past 65504 on the training batches from the
first step, standing in for a checkpoint whose activations already leave float16's range (bench/trl_fp16.py).
Natively (torch's GradScaler, no floor) every SFT step is skipped and the scale halves forever; ``ampsafe run``
backs off to its floor, heals the MLP into FP32 islands and trains, on one process and on 2 gloo ranks alike, and
the ``amp/*`` keys read back from TRL's own log history equal the scaler's records. The grown workload
(``GROWN_ARGS``: HF's default init, AdamW at lr 0.1 on a Qwen3 128 wide; bench/trl_fp16_growth.py): float16 trains
about 10 steps until training has grown an MLP's output past 65504, then ``ampsafe run`` backs off to its
floor and heals alike. GRPO's generation meets the edge's overflow before any optimizer step: natively
torch.multinomial raises on NaN probabilities; ``ampsafe run`` catches that error in HF's ``generate``, islands the
MLP modules whose float16 outputs overflow there (:mod:`ampsafe.hosts._generation`), records the heal on the scaler
(cause "generation overflow") and generates again, and GRPO trains. At HF's default init GRPO generates and trains
under ampsafe's scaler, its ``amp/*`` keys beside its rewards, unhealed.
"""

from __future__ import annotations

import pytest
from trl_helpers import (
    edge_args,
    figures_after,
    finite,
    grown_args,
    history,
    logged_figures,
    run_ampsafe,
    run_native,
    scaler_records,
)

pytest.importorskip("trl", reason="trl is not installed (pip install ampsafe[trl])")
pytestmark = pytest.mark.slow  # each test runs TRL in a subprocess

STEPS = 24  # 16 backoffs from 65536 reach the floor of 1 at step 16; the heal; the MoE backs off 5 more times
FLOOR_STEP = 16
MLP = {"qwen3": "mlp.down_proj", "gemma3": "mlp.down_proj", "qwen3_moe": "mlp.experts"}


def _assert_healed_at_the_floor(record, model: str) -> None:
    assert record.class_name == "ampsafe.torch.scaler.GradScaler", record.class_name  # TRL's scaler, swapped
    assert record.skipped_at[: FLOOR_STEP + 1] == list(range(FLOOR_STEP + 1)), record.steps
    assert record.floor_hits == 1 and record.total_steps == STEPS, record
    (heal,) = record.heal_records
    assert heal.step == FLOOR_STEP and heal.paths[0] == f"model.layers.0.{MLP[model]}", heal
    assert record.steps[-1][2] is False, record.steps  # the last step trained


@pytest.mark.parametrize("model", ["gemma3", "qwen3_moe"])  # Qwen3: the overflow grown by training, below
def test_sft_fp16_heals_the_mlp_overflow_and_amp_keys_reach_trls_log_history(tmp_path, model):
    run_ampsafe(tmp_path, "sft_train.py", *edge_args(model), "--steps", str(STEPS))
    (record,) = scaler_records(tmp_path)
    _assert_healed_at_the_floor(record, model)
    logged = history(tmp_path)
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    for entry in logged:  # what TRL's loggers got at each step is the scaler's own record
        assert logged_figures(entry) == figures_after(record, entry["step"]), entry
    last = logged[-1]  # a trained step: its loss and gradient norm finite
    assert finite(last["loss"]) and last["loss"] > 0 and finite(last["grad_norm"]), last


GROWN_STEPS = 32  # Qwen3 (GROWN_ARGS) trains about 10 steps before its float16 forward overflows, then 16 backoffs


def test_sft_fp16_heals_an_overflow_grown_by_training_and_amp_keys_reach_trls_log_history(tmp_path):
    run_ampsafe(tmp_path, "sft_train.py", *grown_args("qwen3"), "--steps", str(GROWN_STEPS))
    (record,) = scaler_records(tmp_path)
    assert record.class_name == "ampsafe.torch.scaler.GradScaler", record.class_name
    first = record.skipped_at[0]  # HF's default init: float16 trains until lr 0.1 grows an MLP's output
    assert 4 <= first <= GROWN_STEPS - 20, record.steps
    assert record.skipped_at[:17] == list(range(first, first + 17)), record.steps  # skipped until the floor
    assert record.floor_hits == 1 and record.total_steps == GROWN_STEPS, record
    (heal,) = record.heal_records
    assert heal.step == first + 16 and heal.cause == "forward", heal
    assert heal.paths[0].startswith("model.layers.") and heal.paths[0].endswith(".mlp.down_proj"), heal
    assert [s[2] for s in record.steps[heal.step + 1 :]] == [False] * (GROWN_STEPS - heal.step - 1), record.steps
    logged = history(tmp_path)
    assert [entry["step"] for entry in logged] == list(range(1, GROWN_STEPS + 1))
    for entry in logged:  # what TRL's loggers got at each step is the scaler's own record
        assert logged_figures(entry) == figures_after(record, entry["step"]), entry
    last = logged[-1]
    assert finite(last["loss"]) and last["loss"] > 0 and finite(last["grad_norm"]), last


def test_native_sft_fp16_skips_every_step_and_halves_the_scale_forever(tmp_path):
    steps = 12
    updates, _ = run_native(tmp_path, "sft_train.py", *edge_args("qwen3"), "--steps", str(steps))
    assert updates == [(65536.0 / 2**k, 65536.0 / 2 ** (k + 1)) for k in range(steps)]  # torch's scaler, no floor
    logged = history(tmp_path)
    assert len(logged) == steps and not any(finite(e["grad_norm"]) for e in logged)


@pytest.mark.dist
def test_sft_fp16_on_two_gloo_ranks_heals_alike_on_both(tmp_path, free_port):
    out = run_ampsafe(tmp_path, "sft_train.py", *edge_args("qwen3"), "--steps", str(STEPS), ranks=2, port=free_port)
    assert out.count("(DistributedType.MULTI_CPU, DistributedDataParallel)") == 2, out[-3000:]  # DDP on both ranks
    records = scaler_records(tmp_path)
    assert len(records) == 2, records  # one scaler per rank, each in its own process's report
    for record in records:
        _assert_healed_at_the_floor(record, "qwen3")
    assert records[0].heal_records[0].paths == records[1].heal_records[0].paths
    assert records[0].steps == records[1].steps
    logged = history(tmp_path)  # the main process's Trainer writes the state
    assert [logged_figures(e) for e in logged] == [figures_after(records[0], e["step"]) for e in logged]


def test_grpo_generation_overflow_heals_where_native_crashes(tmp_path):
    steps = 4
    updates, out = run_native(tmp_path / "native", "grpo_train.py", *edge_args("qwen3"), "--steps", "1", ok=False)
    assert updates == [], updates  # natively the first generation raised before any optimizer step
    assert "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0" in out, out[-3000:]
    run_ampsafe(tmp_path, "grpo_train.py", *edge_args("qwen3"), "--steps", str(steps))
    (record,) = scaler_records(tmp_path)
    assert record.class_name == "ampsafe.torch.scaler.GradScaler" and record.total_steps == steps, record
    (heal,) = record.heal_records  # at the first generation, before the first optimizer step
    assert heal.step == 0 and heal.cause == "generation overflow" and heal.scale_after == 65536.0, heal
    assert heal.paths[0] == "model.layers.0.mlp.down_proj", heal  # the first module whose float16 output overflows
    assert all(path.endswith(".mlp.down_proj") for path in heal.paths), heal
    assert record.floor_hits == 0 and record.steps[-1][2] is False, record.steps  # the last step trained
    logged = history(tmp_path)
    assert [entry["step"] for entry in logged] == list(range(1, steps + 1))
    assert all("reward" in entry and finite(entry["loss"]) for entry in logged), logged


@pytest.mark.dist
def test_grpo_generation_overflow_heals_on_each_of_two_gloo_ranks(tmp_path, free_port):
    """Each rank generates its own prompts' completions and heals what its own generation shows: both islands
    start at the first layer's MLP, the first module whose float16 output overflows at this init."""
    steps = 3
    out = run_ampsafe(tmp_path, "grpo_train.py", *edge_args("qwen3"), "--steps", str(steps), ranks=2, port=free_port)
    assert out.count("(DistributedType.MULTI_CPU, DistributedDataParallel)") == 2, out[-3000:]  # DDP on both ranks
    records = scaler_records(tmp_path)
    assert len(records) == 2, records
    for record in records:
        assert record.total_steps == steps and record.floor_hits == 0, record
        heal = record.heal_records[0]
        assert heal.step == 0 and heal.cause == "generation overflow", heal
        assert heal.paths[0] == "model.layers.0.mlp.down_proj", heal
        assert all(path.endswith(".mlp.down_proj") for h in record.heal_records for path in h.paths), record
        assert record.steps[-1][2] is False, record.steps  # the last step trained
    logged = history(tmp_path)
    assert [entry["step"] for entry in logged] == list(range(1, steps + 1))
    assert all("reward" in entry and finite(entry["loss"]) for entry in logged), logged


def test_grpo_fp16_generates_and_trains_with_amp_keys_in_trls_log_history(tmp_path):
    steps = 4  # HF's default init: far from float16's edge, nothing overflows
    run_ampsafe(tmp_path, "grpo_train.py", "--model", "qwen3", "--steps", str(steps))
    (record,) = scaler_records(tmp_path)
    assert record.class_name == "ampsafe.torch.scaler.GradScaler" and record.total_steps == steps, record
    assert record.skipped_steps == 0 and not record.heal_records, record.steps  # generation tripped nothing
    logged = history(tmp_path)
    assert [entry["step"] for entry in logged] == list(range(1, steps + 1))
    for entry in logged:  # GRPO's own log (its rewards beside the scaler's figures)
        assert "reward" in entry and logged_figures(entry) == figures_after(record, entry["step"]), entry
