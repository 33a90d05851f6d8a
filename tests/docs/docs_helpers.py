"""What the documentation tests share: the repository's root ``conftest.py`` (the examples' collector), loaded
under its own name, and the site built once per test session."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def examples_module():
    """The root ``conftest.py`` as a module (pytest's own copy is named ``conftest``, as is ``tests/conftest.py``)."""
    spec = importlib.util.spec_from_file_location("ampsafe_docs_examples", REPO / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_site(out: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the repository's mkdocs.yml into ``out``."""
    path = os.pathsep.join([str(REPO), str(REPO / "lab"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
