"""Runs the code examples of README.md and docs/ as tests (sybil): every ```python and ```bash block.

Each block carries a mark on the line before its fence, which says how it runs (``tests/docs/test_examples.py``
checks that every block has one):

- ``<!-- example: run -->``: runs in every ``make test``;
- ``<!-- example: slow -->``: runs, marked ``slow`` (a CPU runs it, in more than a few seconds);
- ``<!-- example: gpu "why" -->``: marked ``gpu``, skipped without a CUDA device;
- ``<!-- example: covered tests/PATH.py -->``: a command that needs an upstream tree or a long run; the test file
  named runs the same trainer under the same command (it must exist), so the block itself is skipped;
- ``<!-- example: skip "why" -->``: not runnable here (the network, or the test suite itself).

Python blocks of one page share a namespace and run in order; every page runs in a fresh temporary directory (with
a copy of PaddleOCR's configs at ``configs/``, as in a PaddleOCR checkout), bash blocks there with ``bash -euo
pipefail``, ``python`` and ``ampsafe`` from this interpreter's environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

REPO = Path(__file__).resolve().parent
PADDLEOCR_CONFIGS = REPO / "lab" / "ampsafe_lab" / "workloads" / "data" / "upstream" / "PaddleOCR" / "configs"
MARK = re.compile(r"<!--\s*example:\s*(?P<kind>run|slow|gpu|covered|skip)\b\s*(?P<arg>.*?)\s*-->")
EXAMPLE_LANGUAGES = ("python", "bash")


def example_mark(text: str, fence_start: int) -> re.Match | None:
    """The ``<!-- example: ... -->`` mark on the last non-blank line before the fence that starts at
    ``fence_start``, or None."""
    before = text[:fence_start].rstrip().splitlines()
    return MARK.fullmatch(before[-1].strip()) if before else None


def _bash(example) -> str | None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "lab")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.parsed],
        cwd=example.namespace["_cwd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        return f"exit status {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    return None


def _setup(namespace: dict) -> None:
    cwd = Path(tempfile.mkdtemp(prefix="ampsafe-docs-"))
    if PADDLEOCR_CONFIGS.is_dir():
        shutil.copytree(PADDLEOCR_CONFIGS, cwd / "configs")
    namespace.update(_cwd=cwd, _previous_cwd=os.getcwd())
    os.chdir(cwd)


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["_previous_cwd"])
    shutil.rmtree(namespace["_cwd"], ignore_errors=True)


SYBIL = Sybil(
    parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=_bash)],
    patterns=["*.md"],
    setup=_setup,
    teardown=_teardown,
)
_collect = SYBIL.pytest()


def documentation_files() -> list[Path]:
    """The pages whose examples run: README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def pytest_collect_file(file_path: Path, parent):
    if file_path in documentation_files():
        return _collect(file_path, parent)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        example = getattr(item, "example", None)
        if example is None:
            continue
        mark = example_mark(example.document.text, example.start)
        kind, arg = (mark["kind"], mark["arg"].strip('"')) if mark else ("unmarked", "")
        if kind == "slow":
            item.add_marker(pytest.mark.slow)
        elif kind == "gpu":
            item.add_marker(pytest.mark.gpu)
            item.add_marker(pytest.mark.skipif(not _has_cuda(), reason=f"needs a CUDA device: {arg}"))
        elif kind == "covered":
            item.add_marker(pytest.mark.skip(reason=f"run by {arg} (upstream tree or long run)"))
        elif kind == "skip":
            item.add_marker(pytest.mark.skip(reason=arg))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
