"""HF ``Trainer`` with ``callbacks=[AmpCallback()]``: the ``amp/*`` keys reach TensorBoard (read back from the
event file ``report_to=["tensorboard"]`` wrote) and equal the Trainer's scaler's own figures.

The script runs under ``ampsafe run --emulate-fp16``, so ``fp16=True`` trains in float16 on this CPU with the
scaler accelerate builds (ampsafe's); at lr 2 the model's own training overflows float16 (skipped steps, a
floor hit, a heal). The script's other user callback adds ``user/marker`` in its ``on_log`` the usual way: that
key never reaches TensorBoard (HF runs user callbacks after its reporting ones), the amp keys do.
"""

from __future__ import annotations

import pytest
from amp_logs import last, run_emulated, scalars, scaler_figures

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("tensorboard")

STEPS = 12


@pytest.mark.slow  # one trainer run under ampsafe run in a subprocess (about 20 s alone on 2 cores)
def test_amp_keys_reach_tensorboard_ahead_of_the_reporting_callback_and_equal_the_scaler(tmp_path):
    args = ("--out", str(tmp_path / "out"), "--steps", str(STEPS))
    proc, figures, skipped = run_emulated(tmp_path, "hf_amp_tensorboard.py", *args, min_scale=2048)
    assert figures["ampsafe_scaler"]  # accelerate's scaler, made ampsafe's by ampsafe run
    # the callback moved itself just ahead of TensorBoardCallback; the user's own callback stays behind it
    order = figures["callbacks"]
    assert order.index("AmpCallback") + 1 == order.index("TensorBoardCallback") < order.index("UserMarker"), order

    series = scalars(tmp_path / "out")
    assert "train/user/marker" not in series  # the pitfall: a key added in a user's on_log is never written
    assert last(series, prefix="train/") == scaler_figures(figures)  # HF's loggers prefix training keys train/
    sampled = last(series, prefix="train/", sampled=True)  # ampsafe run's headroom samples reach the logger too
    assert "amp/min_headroom_bits" in sampled and sampled["amp/grad_norm_unscaled"] > 0
    assert figures["total_steps"] == STEPS and figures["heals"] >= 1 and figures["skipped_steps"] >= 2

    # every training log, step by step: the skipped count after s optimizer steps, from ampsafe run's own summary
    per_step = dict(series["train/amp/skipped_steps"][:STEPS])
    assert per_step == {s: float(sum(k < s for k in skipped)) for s in range(1, STEPS + 1)}
    # and trainer.state.log_history keeps what the loggers got
    trained = [entry for entry in figures["log_history"] if "loss" in entry]
    assert [entry["amp/skipped_steps"] for entry in trained] == [per_step[entry["step"]] for entry in trained]


def _tiny_trainer(tmp_path, **kwargs):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"], use_cpu=True, disable_tqdm=True)
    return Trainer(model=GPT2LMHeadModel(config), args=args, **kwargs)


def test_amp_callback_passed_by_class_or_added_later_sits_ahead_of_the_reporting_callbacks(tmp_path):
    from transformers import PrinterCallback
    from transformers.integrations import TensorBoardCallback

    from ampsafe.integrations.hf import AmpCallback, add_callback

    def order(trainer):
        return [type(cb) for cb in trainer.callback_handler.callbacks]

    by_class = _tiny_trainer(tmp_path / "a", callbacks=[PrinterCallback, AmpCallback])
    found = order(by_class)
    assert found.index(AmpCallback) + 1 == found.index(TensorBoardCallback) < found.index(PrinterCallback), found

    later = _tiny_trainer(tmp_path / "b")
    added = add_callback(later, scaler="the scaler")
    found = order(later)
    assert found.index(AmpCallback) + 1 == found.index(TensorBoardCallback) and found.count(AmpCallback) == 1
    assert isinstance(added, AmpCallback) and added.scaler == "the scaler"
