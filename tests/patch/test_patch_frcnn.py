"""``island`` on torchvision Faster R-CNN at the brink (``ampsafe_lab.workloads.frcnn_brink``), real CPU float16 autocast.

The brink is reached by a realistic recipe (Adam lr 1e-2 with linear warmup, random init) that drives the
unnormalized RoI box head past 65504 in FP32 training; see the module's docstring. Built once and cached.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import ampsafe  # noqa: E402
from ampsafe_lab.workloads import frcnn_brink  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.trajectory]


def _losses(model, inputs, fp16: bool) -> dict:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
        out = frcnn_brink.seeded_forward(model, inputs, seed=0)
    return {k: float(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def brink(brink_seed):
    """The brink workload, its unpatched losses (FP32 and float16), then the same model island-patched."""
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    w = frcnn_brink.brink_workload(brink_seed)
    inputs = w.example_inputs
    before = {"fp32": _losses(w.model, inputs, False), "fp16": _losses(w.model, inputs, True)}
    keys = list(w.model.state_dict())
    scanned = ampsafe.scan(w.model, inputs, level="O1", target="cpu")
    report = ampsafe.patch(w.model, inputs, policy="island", level="O1", report=scanned)
    after = {"fp32": _losses(w.model, inputs, False), "fp16": _losses(w.model, inputs, True)}
    return {"workload": w, "before": before, "after": after, "report": report, "keys": keys}


def test_brink_fp32_forward_exceeds_fp16_max_in_box_head(brink_seed):
    record = frcnn_brink.brink_record(brink_seed)
    assert record["first_layer"].startswith("roi_heads.")
    assert max(record["over_fp16_probe"]["train"].values()) > frcnn_brink.FP16_MAX


def test_unpatched_brink_loss_is_nonfinite_under_cpu_fp16_autocast(brink):
    assert all(math.isfinite(v) for v in brink["before"]["fp32"].values()), brink["before"]["fp32"]
    assert not math.isfinite(sum(brink["before"]["fp16"].values())), brink["before"]["fp16"]


def test_island_makes_brink_loss_finite_under_cpu_fp16_autocast(brink):
    assert all(math.isfinite(v) for v in brink["after"]["fp16"].values()), brink["after"]["fp16"]
    patched = set(brink["report"].patched)
    assert {"roi_heads.box_head.fc6", "roi_heads.box_head.fc7"} <= patched, sorted(patched)


def test_island_keeps_brink_fp32_losses_within_1e5(brink):
    for name, value in brink["before"]["fp32"].items():
        assert brink["after"]["fp32"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name


def test_island_keeps_brink_state_dict_keys(brink):
    assert list(brink["workload"].model.state_dict()) == brink["keys"]
