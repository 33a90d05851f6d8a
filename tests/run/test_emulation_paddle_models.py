"""--emulate-fp16 for Paddle in a process that trains several models one after the other (a sweep, k-fold, a
notebook): each model's ``auto_cast`` blocks are emulated for that model (at O2 its own parameters are the float16
ones), and a model the script dropped is freed, though the emulation cached it as the block's model."""

from __future__ import annotations

import gc
import weakref

import pytest

paddle = pytest.importorskip("paddle")

from paddle import nn  # noqa: E402

from ampsafe.paddle import amp_emulation  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # BatchNorm's "always track global mean"


def _net() -> nn.Layer:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1D(8), nn.ReLU(), nn.Linear(8, 2))


def _train(level: str, decorate: bool):
    """One sweep run: a new model and optimizer, two steps; returns (the model, what the emulation
    saw at each block: (emulated model, fp16 parameter ids), the model's own float16-eligible parameter ids)."""
    model = _net()
    optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    if decorate:
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level=level)
    seen = []
    for _ in range(2):
        with paddle.amp.auto_cast(level=level):
            loss = model(paddle.rand([4, 4])).astype("float32").mean()
            emulator = amp_emulation.current()
            seen.append((emulator.model, {id(p) for p in model.parameters() if emulator.is_fp16(p)}))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    linears = {id(p) for layer in (model[0], model[3]) for p in layer.parameters()}
    return model, seen, linears


@pytest.fixture
def emulated():
    amp_emulation.install()
    try:
        yield
    finally:
        amp_emulation.uninstall()


@pytest.mark.parametrize(("level", "decorate"), [("O2", True), ("O1", False)])
def test_each_model_of_a_sweep_is_emulated_for_itself_and_freed_once_dropped(emulated, level, decorate):
    gc.collect()  # earlier tests' optimizers and models
    runs = []
    for _ in range(2):
        model, seen, linears = _train(level, decorate)
        assert all(emulated is model for emulated, _ in seen), "the block's model is the one trained now"
        if level == "O2":  # its own linear weights are the float16 ones (the BatchNorm's stay float32)
            assert all(fp16 == linears for _, fp16 in seen)
        else:
            assert all(fp16 == set() for _, fp16 in seen)
        runs.append(weakref.ref(model))
        del model, seen
    gc.collect()
    assert all(ref() is None for ref in runs), "a dropped model is freed though the emulation resolved it"
    assert amp_emulation.summary()["model_source"] == ("decorate" if decorate else "optimizer")
    assert amp_emulation.last() is not None and amp_emulation.last().model is None  # it held the model weakly


def test_a_live_earlier_model_does_not_stand_for_the_new_one(emulated):
    """A notebook keeps the first model and its optimizer: the block of the second model, built with its own
    optimizer, resolves again (both optimizers live: both models, as with a GAN's two)."""
    gc.collect()
    first = _net()
    first_opt = paddle.optimizer.SGD(parameters=first.parameters())
    with paddle.amp.auto_cast(level="O1"):
        first(paddle.rand([2, 4]))
        assert amp_emulation.current().model is first
    second = _net()
    second_opt = paddle.optimizer.SGD(parameters=second.parameters())
    with pytest.warns(RuntimeWarning, match="without paddle.amp.decorate"):
        with paddle.amp.auto_cast(level="O2"):
            second(paddle.rand([2, 4]))
            emulator = amp_emulation.current()
    assert emulator.is_fp16(second[0].weight) and emulator.is_fp16(first[0].weight)
    del first_opt, first
    gc.collect()
    with paddle.amp.auto_cast(level="O2"):  # the first one died: resolved again, to the second alone
        assert amp_emulation.current().model is second
    del second_opt
