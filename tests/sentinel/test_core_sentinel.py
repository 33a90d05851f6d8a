"""The framework-neutral verdicts, sample rows and headroom warnings behind ampsafe.watch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ampsafe
from ampsafe.core import sentinel as core


@pytest.mark.parametrize(
    ("low", "inputs_finite", "rerun", "from_param", "kind"),
    [
        (True, True, True, False, "overflow"),
        (True, True, False, False, "numerical"),
        (False, True, None, False, "numerical"),
        (True, True, None, False, "numerical"),  # no rerun verdict: not claimed as overflow
        (True, False, None, False, "input"),
        (False, False, None, True, "parameter"),
    ],
)
def test_verdict_separates_overflow_numerical_input_and_parameter(low, inputs_finite, rerun, from_param, kind):
    assert core.verdict(low, inputs_finite, rerun, from_param=from_param) == kind


def test_first_nonfinite_row_only_on_the_batch_dim():
    a = np.zeros((4, 3))
    a[2, 1] = np.inf
    a[3, 0] = np.nan
    assert core.first_nonfinite_row(a, 4) == 2
    assert core.first_nonfinite_row(a, 8) is None  # dim 0 is not the batch
    assert core.first_nonfinite_row(np.zeros(4), 4) is None


def test_tensor_stats_report_finite_range_and_bad_counts():
    stats = core.tensor_stats(np.array([0.5, -3.0, np.nan, np.inf]))
    assert (stats["absmin"], stats["absmax"], stats["nan"], stats["inf"]) == (0.5, 3.0, 1, 1)


def test_error_message_names_op_pass_sample_and_fix():
    err = core.nonfinite_error(phase="forward", module="neck.conv", op="conv2d", kind="overflow", sample=3)
    assert isinstance(err, ampsafe.NonFiniteError) and isinstance(err, ampsafe.AmpSafeError)
    assert (err.phase, err.module, err.op, err.kind, err.sample) == ("forward", "neck.conv", "conv2d", "overflow", 3)
    assert "neck.conv:conv2d" in str(err) and "sample 3" in str(err) and "ampsafe.patch" in str(err)


def test_headroom_warns_once_per_path_below_margin_and_again_on_overflow():
    seen: set = set()
    paths = {"a": (("a", "b"), 5000.0), "c": (("c",), 100.0)}
    first = core.headroom_warnings(paths, margin_bits=4.0, step=10, already=seen)
    assert [w.start for w in first] == ["a"] and first[0].headroom_bits == pytest.approx(math.log2(65504 / 5000))
    assert core.headroom_warnings(paths, margin_bits=4.0, step=20, already=seen) == []
    over = core.headroom_warnings({"a": (("a",), 7e4)}, margin_bits=4.0, step=30, already=seen)
    assert len(over) == 1 and "already exceeds" in over[0].message
