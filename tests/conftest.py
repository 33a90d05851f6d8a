"""Shared test configuration. Expensive fixtures (built models, the DBNet brink checkpoint) are session-scoped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AMPSAFE_SHARED", REPO.parent / "shared"))
UPSTREAM = SHARED / "upstream"


@pytest.fixture(scope="session")
def upstream() -> Path:
    if not UPSTREAM.is_dir():
        pytest.fail(f"upstream test data not found at {UPSTREAM} (set AMPSAFE_SHARED to the shared/ folder)")
    return UPSTREAM


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
