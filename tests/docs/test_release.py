"""One version (``ampsafe.__version__``, read by setup.py, printed by ``ampsafe --version``, in the metadata), a
Keep a Changelog CHANGELOG.md with that version, and the wheel's metadata, built offline from setup.py."""

from __future__ import annotations

import re
import subprocess
import sys
from email.parser import Parser

import pytest
from docs_helpers import REPO

import ampsafe
from ampsafe import cli

SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    """The wheel's METADATA as setuptools' PEP 517 hook writes it (no network, no build isolation)."""
    out = tmp_path_factory.mktemp("meta")
    code = "import sys, setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    dist_info = out / done.stdout.strip().splitlines()[-1]
    return Parser().parsestr((dist_info / "METADATA").read_text(encoding="utf-8"))


def test_the_version_is_one_value_everywhere(metadata, capsys):
    assert re.fullmatch(r"\d+\.\d+\.\d+", ampsafe.__version__)
    assert metadata["Version"] == ampsafe.__version__
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ampsafe {ampsafe.__version__}"
    lab = (REPO / "lab" / "setup.py").read_text(encoding="utf-8")
    assert set(re.findall(r"ampsafe(?:\[\w+\])?==([\w.]+)", lab)) == {ampsafe.__version__}  # the lab's pins


def test_the_changelog_keeps_a_changelog_and_has_this_version():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert releases[0] == ("Unreleased", "")
    assert (ampsafe.__version__, releases[1][1]) in releases and releases[1][1]
    assert set(re.findall(r"^### (.+)$", text, flags=re.M)) <= SECTIONS


def test_the_metadata_declares_the_extras_classifiers_and_entry_point(metadata):
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"torch", "hf", "lightning", "mmengine", "ultralytics", "deepspeed", "docs", "dev"} <= extras
    requires = metadata.get_all("Requires-Dist")
    assert not any(r.startswith("paddlepaddle") for r in requires)  # never: it would clobber a user's Paddle build
    assert 'mkdocs==1.6.1; extra == "docs"' in requires
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3" in classifiers and len(classifiers) >= 5
    assert metadata["Requires-Python"] == ">=3.9"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "ampsafe run -- python train.py" in metadata.get_payload()  # the README is the long description


def test_the_metadata_declares_the_license_and_ships_its_text(metadata):
    assert (metadata["License-Expression"] or metadata["License"]) == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


def test_the_readme_lists_every_extra(metadata):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert [e for e in metadata.get_all("Provides-Extra") if f"`[{e}]`" not in readme] == []
