"""``ampsafe.scan`` of a batch with a NaN pixel names the input instead of flagging every path.

One NaN pixel made every conv path of a real network ``(inf, 'forward')`` risky: what the data did, not float16.
The scan checks the batch first and raises :class:`ScanError` naming the input and its sample; nothing runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ampsafe
from ampsafe.scanner import ScanError


def _images() -> np.ndarray:
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    x[1, 2, 4, 9] = math.nan
    return x


def test_torch_nan_pixel_is_named_not_every_path():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=4)
    with pytest.raises(ScanError, match=r"example_inputs holds a non-finite value at args\[0\]\[1\] \(sample 1\)"):
        ampsafe.scan(model, (torch.from_numpy(_images()),))
    with pytest.raises(ScanError, match=r"at x\[1\] \(sample 1\).*Fix or drop that sample"):
        ampsafe.scan(model, {"x": torch.from_numpy(_images())})  # keyword inputs by their name
    clean = torch.from_numpy(np.nan_to_num(_images()))
    assert not any(p.overflows_in for p in ampsafe.scan(model, (clean,)).paths)  # the same batch, fixed


def test_paddle_nan_pixel_is_named_not_every_path():
    paddle = pytest.importorskip("paddle")
    model = paddle.vision.models.resnet18(num_classes=4)
    with pytest.raises(ScanError, match=r"args\[0\]\[1\] \(sample 1\)"):
        ampsafe.scan(model, (paddle.to_tensor(_images()),))
