"""The installed package stands on its own: it reads no file outside itself and never imports ``bench``.

The default upstream configs ship as package data (``ampsafe/workloads/data/upstream``, byte-identical copies of
the test data in shared/upstream), and a wheel built from the repository, installed into a fresh environment and
run from a folder outside the checkout, runs ``ampsafe demo``'s first step exactly as the checkout does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

import ampsafe
from ampsafe.workloads.upstream import PACKAGED

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(ampsafe.__file__).resolve().parent
SHIPPED = sorted(p.relative_to(PACKAGED).as_posix() for p in PACKAGED.rglob("*.yml"))


def test_packaged_configs_are_unmodified_copies_of_upstream_with_their_source_listed(upstream_tree):
    sources = (PACKAGED / "SOURCES.md").read_text(encoding="utf-8")
    assert len(SHIPPED) == 18, SHIPPED
    for rel in SHIPPED:
        assert (PACKAGED / rel).read_bytes() == (upstream_tree / rel).read_bytes(), rel
        repo_name, path = rel.split("/", 1)
        listed = f"| PaddlePaddle/{repo_name} | {path} |" in sources
        gap_filler = f"{repo_name} `{path}` = `" in sources
        assert listed or gap_filler, f"{rel} is not listed in {PACKAGED / 'SOURCES.md'}"


class _TagBlindLoader(yaml.SafeLoader):
    """ppdet's configs tag objects (``!PiecewiseDecay``); only ``_BASE_`` is read here."""


_TagBlindLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _bases(path: Path) -> list[Path]:
    """``path`` and every file of its ``_BASE_`` chain."""
    base = yaml.load(path.read_text(encoding="utf-8"), Loader=_TagBlindLoader).get("_BASE_", [])
    out = [path]
    for ref in [base] if isinstance(base, str) else base:
        out += _bases((path.parent / ref).resolve())
    return out


def test_workload_defaults_resolve_inside_the_package(monkeypatch):
    from ampsafe.workloads import ppyolo
    from ampsafe.workloads.dbnet import config

    monkeypatch.delenv("AMPSAFE_SHARED", raising=False)
    assert config.default_config_path() == PACKAGED / "PaddleOCR/configs/det/det_mv3_db.yml"
    assert config.load_config()["Architecture"] == config.BUILTIN_DET_MV3_DB["Architecture"]
    assert ppyolo.upstream_dir() == PACKAGED / "PaddleDetection"
    for name, (rel, _, _) in ppyolo.CONFIGS.items():
        chain = _bases(ppyolo.upstream_dir() / rel)
        assert len(chain) == 6 and all(p.is_file() and PACKAGED in p.parents for p in chain), (name, chain)


def test_workload_cache_defaults_outside_the_checkout(monkeypatch, tmp_path):
    from ampsafe.workloads.cache import cache_dir

    monkeypatch.delenv("AMPSAFE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "ampsafe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "ampsafe"
    monkeypatch.setenv("AMPSAFE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and cache_dir(tmp_path / "x") == tmp_path / "x"


def test_library_never_imports_bench_nor_reaches_for_shared():
    imports_bench = re.compile(r"^\s*(from|import)\s+bench\b|import_module\(\s*[\"']bench", re.M)
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not imports_bench.search(text), f"{path} imports bench"
        assert '/ "shared"' not in text and "parents[3]" not in text and "parents[4]" not in text, path


def test_ampsafe_bench_outside_a_checkout_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from ampsafe.benchcmd import find_checkout
    from ampsafe.cli import main

    assert find_checkout(REPO / "tests") == REPO
    monkeypatch.chdir(tmp_path)
    assert find_checkout() is None
    assert main(["bench", "--suite", "quick"]) == 1
    assert "not inside a source checkout of ampsafe" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- the wheel

_SKIP = {".git", ".venv", "build", "dist", ".cache", ".pytest_cache", ".ruff_cache", ".hypothesis", "__pycache__"}
_DEMO = ["demo", "--modes", "native", "--steps", "1", "--out", "out"]
PROBE = """
import json, sys, ampsafe
from ampsafe.workloads import ppyolo
from ampsafe.workloads.dbnet import config
print(json.dumps({"ampsafe": ampsafe.__file__, "dbnet": str(config.default_config_path()),
                  "ppyolo": str(ppyolo.upstream_dir()), "bench": "bench" in sys.modules}))
"""


def _ignore(folder: str, names: list[str]) -> set[str]:
    rel = Path(folder).resolve().relative_to(REPO).as_posix()
    skipped = {n for n in names if n in _SKIP or n.endswith(".egg-info")}
    if rel == ".":
        skipped |= {"tmp", "ampsafe-demo"}
    if rel == "bench":
        skipped.add("results")
    return skipped


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("AMPSAFE_SHARED", "AMPSAFE_CACHE", "PYTHONPATH")}
    return {**env, **extra}


def _first_loss(folder: Path) -> tuple[float, str]:
    data = json.loads((folder / "out" / "demo-paddle-O1.json").read_text())
    assert [t["mode"] for t in data["traces"]] == ["native"] and len(data["traces"][0]["losses"]) == 1
    return data["traces"][0]["losses"][0], data["setup"]


@pytest.mark.slow
def test_wheel_installed_elsewhere_runs_the_demo_as_the_checkout_does(tmp_path):
    pytest.importorskip("paddle")
    # build from a copy of the working tree, so no stale build/ folder leaks in and the checkout stays clean
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    shutil.copytree(REPO, src, ignore=_ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("ampsafe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("ampsafe/patches/__init__.py", "ampsafe/patches/swap.py", "ampsafe/workloads/heal_runs.py"):
        assert rel in names, rel
    data = {"ampsafe/workloads/data/upstream/" + rel for rel in [*SHIPPED, "SOURCES.md"]}
    assert data <= names, sorted(data - names)
    assert not any(n.startswith(("bench/", "tests/", "patches/")) for n in names)

    # a fresh environment with the wheel, then the repository venv's site-packages appended for the frameworks
    # (a .pth line only extends sys.path: the editable install's finder there is not run, so it shadows nothing)
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True, symlinks=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    frameworks = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "zz_ampsafe_test_frameworks.pth").write_text("".join(f"{p}\n" for p in frameworks))

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    probe = json.loads(subprocess.check_output([python, "-c", PROBE], cwd=outside, env=env, text=True, timeout=300))
    for key in ("ampsafe", "dbnet", "ppyolo"):
        assert Path(probe[key]).is_relative_to(site / "ampsafe"), (key, probe[key], site)
    assert not probe["bench"]

    # the wheel's console script, run from a folder outside the checkout
    subprocess.run([env_dir / "bin" / "ampsafe", *_DEMO], cwd=outside, env=env, check=True, timeout=300)
    # the checkout's run, as `make demo` runs it (.venv's console script, from the repository root)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    repo_cli = Path(sys.executable).parent / "ampsafe"
    command = [repo_cli] if repo_cli.is_file() else [sys.executable, "-m", "ampsafe.cli"]
    subprocess.run([*command, *_DEMO[:-1], checkout / "out"], cwd=REPO, env=_clean_env(), check=True, timeout=300)
    (wheel_loss, wheel_setup), (repo_loss, repo_setup) = _first_loss(outside), _first_loss(checkout)
    print(f"first-step loss: checkout {repo_loss!r}, wheel {wheel_loss!r}")
    assert wheel_setup == repo_setup
    assert wheel_loss == pytest.approx(repo_loss, rel=1e-6)
