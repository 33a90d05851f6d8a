"""Shared test configuration. Expensive fixtures (built models, the DBNet brink checkpoint) are session-scoped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AMPSAFE_SHARED", REPO.parent / "shared"))
UPSTREAM = SHARED / "upstream"
# The library reads its own packaged copies of the default upstream configs; the tests build every upstream config,
# so they point the workloads at the full copy (subprocesses inherit it). tests/test_wheel.py unsets it.
os.environ.setdefault("AMPSAFE_SHARED", str(SHARED))
# The brink checkpoints: the checkout's .cache/ampsafe (the library's default is ~/.cache/ampsafe).
os.environ.setdefault("AMPSAFE_CACHE", str(REPO / ".cache" / "ampsafe"))


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


@pytest.fixture
def free_port() -> int:
    """A free TCP port on loopback, for a 2-process gloo group."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def worker_module(request):
    """Import a helper module that sits beside the requesting test file (spawned workers must be importable)."""
    import importlib
    import sys

    folder = str(Path(request.fspath).parent)

    def load(name: str):
        sys.path.insert(0, folder)
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(folder)

    return load


def brink_seeds() -> list[int]:
    """The seeds the brink and trajectory tests train with: ``$AMPSAFE_TEST_SEEDS`` (``make test-isa`` sets
    "0,1,2"), else seed 0 alone."""
    raw = os.environ.get("AMPSAFE_TEST_SEEDS", "0")
    try:
        return [int(s) for s in raw.split(",") if s.strip()]
    except ValueError:
        raise pytest.UsageError(f"AMPSAFE_TEST_SEEDS must be comma-separated integers, got {raw!r}") from None


def pytest_generate_tests(metafunc):
    # A test (or any fixture it uses) that asks for ``brink_seed`` runs once per seed, sharing module fixtures.
    if "brink_seed" in metafunc.fixturenames:
        metafunc.parametrize("brink_seed", brink_seeds(), scope="module", ids=lambda s: f"seed{s}")
