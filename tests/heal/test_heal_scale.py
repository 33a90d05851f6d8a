"""Which scale a heal restarts from: the one before the collapse, not the last clean step's."""

from __future__ import annotations

from ampsafe.healing import nonfinite_sample, restore_scale


def test_restore_scale_skips_clean_steps_inside_the_collapse():
    # a step at 256 and one at 1 were clean (backward-only overflow), yet the collapse started from 1024
    history = [1024.0] * 9 + [512.0, 256.0, 256.0, 128.0, 64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0, 1.0]
    assert restore_scale(history) == 1024.0


def test_restore_scale_stops_at_the_last_growth():
    assert restore_scale([1024.0, 2048.0, 2048.0, 1024.0, 512.0]) == 2048.0
    assert restore_scale([]) is None


def test_nonfinite_sample_names_input_and_batch_index():
    import numpy as np

    a, b = np.zeros((4, 2), "float32"), np.zeros((3, 5), "float32")
    b[2, 1] = np.nan
    assert nonfinite_sample((a, {"x": b})) == (1, 2)
    assert nonfinite_sample((a, np.ones(3, "float32"))) is None
