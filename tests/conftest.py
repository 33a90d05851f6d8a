"""Shared test configuration. Expensive fixtures (built models, the DBNet brink checkpoint) are session-scoped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AMPSAFE_SHARED", REPO.parent / "shared"))
UPSTREAM = SHARED / "upstream"
HAS_UPSTREAM = UPSTREAM.is_dir()
SET_SHARED = "set AMPSAFE_SHARED to the shared/ folder"
# The library reads its own packaged copies of the default upstream configs; the tests build every upstream config,
# so they point the workloads at the full copy (subprocesses inherit it) when there is one. tests/test_wheel.py
# unsets it. A clone with no shared/ beside it runs on the packaged copies.
if HAS_UPSTREAM:
    os.environ.setdefault("AMPSAFE_SHARED", str(SHARED))
# The brink checkpoints: the checkout's .cache/ampsafe (the library's default is ~/.cache/ampsafe).
os.environ.setdefault("AMPSAFE_CACHE", str(REPO / ".cache" / "ampsafe"))
# PaddleOCR's source tree (tools/train.py, ppocr): $PADDLEOCR_SRC, else the unmodified copy in shared/upstream
PADDLEOCR_SRC = Path(os.environ.get("PADDLEOCR_SRC") or UPSTREAM / "PaddleOCR-src")
# what PaddleOCR's tools/train.py imports at start-up beyond ampsafe's own requirements (import name: package);
# requirements-dev.txt pins them
PADDLEOCR_IMPORTS = {"skimage": "scikit-image", "imgaug": "imgaug", "lmdb": "lmdb", "rapidfuzz": "rapidfuzz"}


class _PackagedUpstream(type(Path())):
    """The package's own copy of the upstream configs (``ampsafe_lab/workloads/data/upstream``), standing in for
    shared/upstream in a clone without it: a path into it that the package does not ship skips the test, saying
    what to set."""

    def __truediv__(self, key):
        path = super().__truediv__(key)
        if not path.exists():
            rel = path.relative_to(_packaged())
            pytest.skip(f"needs shared/upstream/{rel} (the package ships only the default configs): {SET_SHARED}")
        return path


def _packaged() -> Path:
    from ampsafe_lab.workloads.upstream import PACKAGED

    return PACKAGED


@pytest.fixture(scope="session")
def upstream() -> Path:
    """shared/upstream, else the package's own copy of the configs it ships (other files skip the test)."""
    return UPSTREAM if HAS_UPSTREAM else _PackagedUpstream(_packaged())


@pytest.fixture(scope="session")
def upstream_tree() -> Path:
    """shared/upstream itself (tests that compare against it or run what only it holds)."""
    if not HAS_UPSTREAM:
        pytest.skip(f"needs the upstream test data at {UPSTREAM}: {SET_SHARED}")
    return UPSTREAM


def paddleocr_missing() -> str:
    """Why PaddleOCR's own code cannot run here ("" when it can): no source tree, or its start-up packages."""
    if not (PADDLEOCR_SRC / "tools" / "train.py").is_file() or not (PADDLEOCR_SRC / "ppocr").is_dir():
        return (
            f"needs a PaddleOCR source tree (tools/train.py, ppocr/) at {PADDLEOCR_SRC}: set PADDLEOCR_SRC to one, "
            f"or {SET_SHARED}"
        )
    import importlib.util

    missing = [pkg for mod, pkg in PADDLEOCR_IMPORTS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        return f"PaddleOCR's start-up imports {', '.join(missing)}: install requirements-dev.txt (make venv)"
    return ""


@pytest.fixture(scope="session")
def paddleocr_src() -> Path:
    """PaddleOCR's unmodified source tree (``$PADDLEOCR_SRC``, else shared/upstream/PaddleOCR-src)."""
    why = paddleocr_missing()
    if why:
        pytest.skip(why)
    return PADDLEOCR_SRC


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
