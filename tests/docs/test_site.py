"""The documentation site builds with ``mkdocs build --strict`` (no broken link, no missing reference), and its
generated pages cover what the code has: every name of the API contract, every command's options, every error
ampsafe raises, every result file with its machine."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docs_helpers import REPO

import ampsafe
from ampsafe.cli import COMMANDS

SHARED = Path(os.environ.get("AMPSAFE_SHARED", REPO.parent / "shared"))
API_CONTRACT = SHARED / "API.md"
# contract names that moved, with the issue that moved them (README "Additions to the API contract")
MOVED = {"ampsafe.workloads.build": "ampsafe_lab.workloads.build"}  # issue 41: the workloads are the lab's
API_PAGE = REPO / "docs" / "reference" / "api.md"


def contract_names(text: str) -> set[str]:
    """The public names API.md spells: every dotted ``ampsafe.x.y``, and every bare capitalized name that
    ``ampsafe`` exports (``ScanReport``, ``NonFiniteError``, ``ConvBN``, ...)."""
    dotted = set(re.findall(r"\bampsafe(?:\.[A-Za-z_]\w*)+", text))
    bare = {f"ampsafe.{word}" for word in re.findall(r"\b[A-Z]\w+\b", text) if word in ampsafe.__all__}
    return {MOVED.get(name, name) for name in dotted | bare}


def test_contract_names_are_read_from_api_md():
    names = contract_names("`ampsafe.scan(model)` returns a `ScanReport`; `ampsafe.workloads.build` ... Foo")
    assert names == {"ampsafe.scan", "ampsafe.ScanReport", "ampsafe_lab.workloads.build"}


def test_every_name_of_the_api_contract_has_its_section_in_the_built_reference(site):
    if not API_CONTRACT.is_file():
        pytest.skip(f"needs {API_CONTRACT}: set AMPSAFE_SHARED to the shared/ folder")
    names = contract_names(API_CONTRACT.read_text(encoding="utf-8")) | {f"ampsafe.{n}" for n in ampsafe.__all__}
    html = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    missing = sorted(name for name in names if f'id="{name}"' not in html)
    assert not missing, f"docs/reference/api.md has no section for {missing}"
    assert html.count('class="doc doc-object') >= len(names)  # mkdocstrings rendered a docstring for each


def test_each_reference_section_documents_the_object_of_its_name():
    """A section ``{#ampsafe.x}`` is followed by the directive of the object that name resolves to (the same
    last name; the module that defines it, since the public names load lazily)."""
    pairs = re.findall(r"\{#([\w.]+)\}\n::: ([\w.]+)", API_PAGE.read_text(encoding="utf-8"))
    assert len(pairs) >= 30
    for public, target in pairs:
        assert public.rsplit(".", 1)[-1] == target.rsplit(".", 1)[-1], (public, target)


def _help(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "ampsafe.cli", *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    return done.stdout + done.stderr


def test_the_cli_reference_holds_every_command_and_every_option_of_its_parser(site):
    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"ampsafe {name}" in html
        options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", _help(name, "--help")))
        assert options, name
        assert all(option in html for option in options), (name, sorted(o for o in options if o not in html))


def _ampsafe_errors() -> set[str]:
    """Every class in the package that derives from ``AmpSafeError`` (read from the source, nothing imported)."""
    bases: dict[str, set[str]] = {}
    for path in (REPO / "ampsafe").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
    errors = {"AmpSafeError"}
    while True:
        more = {name for name, of in bases.items() if of & errors} - errors
        if not more:
            return errors
        errors |= more


def test_troubleshooting_has_a_section_for_every_error_ampsafe_raises():
    errors = _ampsafe_errors()
    assert set(ampsafe.errors.__all__) <= errors and {"ScanError", "SkippedStepsError"} <= errors
    page = (REPO / "docs" / "reference" / "troubleshooting.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\w+)$", page, flags=re.M))
    assert not errors - sections, f"docs/reference/troubleshooting.md lacks {sorted(errors - sections)}"


def test_every_result_file_is_served_and_listed_with_its_machine(site):
    results = REPO / "bench" / "results"
    for path in results.rglob("*"):
        if path.suffix in {".png", ".json"}:
            assert (site / path.relative_to(REPO)).is_file(), path
    index = (site / "results" / "index.html").read_text(encoding="utf-8")
    for path in results.rglob("*.json"):
        machine = json.loads(path.read_text(encoding="utf-8")).get("machine") or {}
        assert path.stem in index
        if machine.get("date"):
            assert machine["date"] in index
