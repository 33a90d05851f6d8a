"""The seed's O2 case: at PaddleOCR's default level the DBHead step function's ``exp`` overflows float16 from
the first step, on the real ``dbnet`` workload, and ``watch`` names it (at O1 the same step is clean)."""

from __future__ import annotations

import pytest

import ampsafe

pytest.importorskip("paddle")


def _first_nonfinite(level: str):
    import ampsafe_lab.workloads
    from ampsafe.paddle import emulate_fp16

    w = ampsafe_lab.workloads.build("dbnet", seed=0, image_size=64, batch_size=2)
    batch = w.batch(0)
    with emulate_fp16(w.model, level=level), ampsafe.watch(w.model):
        w.loss(batch).backward()


def test_watch_names_the_step_function_exp_at_o2_from_random_init():
    with pytest.raises(ampsafe.NonFiniteError) as info:
        _first_nonfinite("O2")
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "head", "exp", "overflow")
    assert err.sample == 0


def test_the_same_step_is_clean_at_o1():
    _first_nonfinite("O1")
