"""T5 under float16: the discarded log(0) of its position bucketing is no event; a real ``wo`` overflow is.

HF transformers issue #5651: T5's ``DenseReluDense.wo`` output passed 65504 in float16 and the loss went NaN.
Here the overflow is made real by scaling ``wo``'s weight so that its float32 output reaches twice 65504 (the
float16 linear then overflows to inf, and T5's float32 residual stream carries it to the loss), not by
editing values after the fact.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_models import batch, build, scale_past_float16  # noqa: E402

import ampsafe  # noqa: E402

WO = "decoder.block.1.layer.2.DenseReluDense.wo"


def _t5():
    return build("t5", "eager", dropout_rate=0.0)


def _float16_step(model, inputs):
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(**inputs)
    out.loss.backward()
    return out


def test_t5_position_bucketing_really_takes_log_of_zero():
    """The premise of the next test: T5's bucketing makes -inf lanes in the forward (and discards them)."""
    model, inputs = _t5(), batch("t5")
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "log" and isinstance(out, torch.Tensor):
                seen.append(bool(torch.isinf(out).any()))
            return out

    with Spy(), torch.no_grad():
        model(**inputs)
    assert any(seen)


def test_healthy_float16_t5_step_under_watch_raises_nothing():
    model, inputs = _t5(), batch("t5")
    with ampsafe.watch(model) as w:
        out = _float16_step(model, inputs)
    assert w.events == []
    assert torch.isfinite(out.loss)


def test_healthy_float16_t5_step_under_the_guard_passes():
    model, inputs = _t5(), batch("t5")
    with ampsafe.watch(model, guard=True) as w:
        out = _float16_step(model, inputs)
        assert w.check(out.loss, replay=lambda: model(**inputs).loss)
    assert w.events == []


def test_real_wo_overflow_is_caught_and_named():
    model, inputs = _t5(), batch("t5")
    scale_past_float16(model, WO, inputs)
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with ampsafe.watch(model):
            _float16_step(model, inputs)
    err = info.value
    assert err.module.endswith("DenseReluDense.wo"), err
    assert err.module == WO
    assert (err.phase, err.op, err.kind) == ("forward", "linear", "overflow")


def test_scan_names_the_overflowing_wo_not_the_masks():
    model, inputs = _t5(), batch("t5")
    scale_past_float16(model, WO, inputs)
    report = ampsafe.scan(model, inputs)
    wo = report.path(WO)
    assert wo.risky and wo.overflows_in == "forward"
    assert 65504 < wo.amax < 4 * 65504
    assert not any(p.start.endswith(("SelfAttention", "EncDecAttention")) for p in report.risky)
    # under autocast the residual stream wo's output joins is float32 (float32 embeddings promote the adds): the
    # earlier o/wo paths that feed it are not float16 there, so only wo (and wi, whose path ends at wo) is risky
    assert {p.start for p in report.risky} == {WO, WO.replace(".wo", ".wi")}, [p.start for p in report.risky]
    assert wo.peak.startswith(WO + ":")
