"""The installed package stands on its own: it reads no file outside itself and never imports ``bench``.

The default upstream configs ship as package data (``lab/ampsafe_lab/workloads/data/upstream``, byte-identical copies of
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
import ampsafe_lab
from ampsafe_lab.workloads.upstream import PACKAGED

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(ampsafe.__file__).resolve().parent
LAB = Path(ampsafe_lab.__file__).resolve().parent
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
    from ampsafe_lab.workloads import ppyolo
    from ampsafe_lab.workloads.dbnet import config

    monkeypatch.delenv("AMPSAFE_SHARED", raising=False)
    assert config.default_config_path() == PACKAGED / "PaddleOCR/configs/det/det_mv3_db.yml"
    assert config.load_config()["Architecture"] == config.BUILTIN_DET_MV3_DB["Architecture"]
    assert ppyolo.upstream_dir() == PACKAGED / "PaddleDetection"
    for name, (rel, _, _) in ppyolo.CONFIGS.items():
        chain = _bases(ppyolo.upstream_dir() / rel)
        assert len(chain) == 6 and all(p.is_file() and PACKAGED in p.parents for p in chain), (name, chain)


def test_workload_cache_defaults_outside_the_checkout(monkeypatch, tmp_path):
    from ampsafe_lab.workloads.cache import cache_dir

    monkeypatch.delenv("AMPSAFE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "ampsafe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "ampsafe"
    monkeypatch.setenv("AMPSAFE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and cache_dir(tmp_path / "x") == tmp_path / "x"


def test_library_never_imports_bench_nor_reaches_for_shared():
    imports_bench = re.compile(r"^\s*(from|import)\s+bench\b|import_module\(\s*[\"']bench", re.M)
    for path in sorted([*PACKAGE.rglob("*.py"), *LAB.rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        assert not imports_bench.search(text), f"{path} imports bench"
        assert '/ "shared"' not in text and "parents[3]" not in text and "parents[4]" not in text, path


def test_ampsafe_bench_outside_a_checkout_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from ampsafe.cli import main
    from ampsafe_lab.benchcmd import find_checkout

    assert find_checkout(REPO / "tests") == REPO
    monkeypatch.chdir(tmp_path)
    assert find_checkout() is None
    assert main(["bench", "--suite", "quick"]) == 1
    assert "not inside a source checkout of ampsafe" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- the wheels

_SKIP = {".git", ".venv", "build", "dist", ".cache", ".pytest_cache", ".ruff_cache", ".hypothesis", "__pycache__"}
_DEMO = ["demo", "--modes", "native", "--steps", "1", "--out", "out"]
PROBE = """
import json, sys, ampsafe
from ampsafe_lab.workloads import ppyolo
from ampsafe_lab.workloads.dbnet import config
print(json.dumps({"ampsafe": ampsafe.__file__, "dbnet": str(config.default_config_path()),
                  "ppyolo": str(ppyolo.upstream_dir()), "bench": "bench" in sys.modules}))
"""
# the library alone: ampsafe.patch on a torch model, and the lab is not there
LIBRARY_PROBE = """
import json, torch, ampsafe
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
report = ampsafe.patch(model, (torch.randn(1, 3, 16, 16),), policy="island")
try:
    import ampsafe_lab
    lab = ampsafe_lab.__file__
except ImportError:
    lab = None
print(json.dumps({"ampsafe": ampsafe.__file__, "patched": list(report.patched), "lab": lab}))
"""
FACTORY = """
import torch

def make():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
    return model, (torch.randn(1, 3, 16, 16),)
"""


def _ignore(folder: str, names: list[str]) -> set[str]:
    rel = Path(folder).resolve().relative_to(REPO).as_posix()
    skipped = {n for n in names if n in _SKIP or n.endswith(".egg-info")}
    if rel == ".":
        skipped |= {"tmp", "ampsafe-demo", "ampsafe-run"}
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


def _pip_wheel(src: Path, wheels: Path, pattern: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob(pattern)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple[Path, Path]:
    """(the library's wheel, the lab's wheel), built from a copy of the working tree, so no stale build/ folder
    leaks in and the checkout stays clean."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_ignore)
    return _pip_wheel(src, tmp / "library", "ampsafe-*.whl"), _pip_wheel(src / "lab", tmp / "lab", "ampsafe_lab-*.whl")


def _fresh_env(env_dir: Path, *wheel_files: Path) -> tuple[Path, Path]:
    """A fresh environment with ``wheel_files`` installed, then the repository venv's site-packages appended for the
    frameworks (a .pth line only extends sys.path: the editable installs' finders and .pth files there are not run,
    so they shadow nothing; their metadata is visible, which is why a missing lab must be told by its import).
    Returns (its python, its site-packages)."""
    venv.create(env_dir, with_pip=True, symlinks=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheel_files)],
        check=True,
        timeout=300,
        env=_clean_env(),  # a PYTHONPATH's packages would count as installed already
    )
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    frameworks = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "zz_ampsafe_test_frameworks.pth").write_text("".join(f"{p}\n" for p in frameworks))
    return python, site


def test_the_library_wheel_holds_no_lab_file_and_the_lab_wheel_holds_the_lab(wheels):
    library, lab = (set(zipfile.ZipFile(w).namelist()) for w in wheels)
    for rel in ("ampsafe/patches/__init__.py", "ampsafe/patches/swap.py", "ampsafe/cli.py", "ampsafe/_lab.py"):
        assert rel in library, rel
    # the necks ampsafe.patches swaps in are the library's; the networks the workloads build are the lab's
    assert {n for n in library if n.startswith("ampsafe/paddle/nets/")} == {
        f"ampsafe/paddle/nets/{m}.py" for m in ("__init__", "paddleocr_necks", "ppdet_necks")
    }
    lab_roots = ("ampsafe_lab/", "lab/", "ampsafe/workloads/", "ampsafe/torch/nets/", "bench/", "tests/", "patches/")
    assert not [n for n in library if n.startswith(lab_roots)]
    assert not {"ampsafe/demo.py", "ampsafe/benchcmd.py"} & library
    assert not [n for n in library if n.endswith(".yml")]
    (library_entry_points,) = [n for n in library if n.endswith(".dist-info/entry_points.txt")]
    assert "ampsafe.lab" not in zipfile.ZipFile(wheels[0]).read(library_entry_points).decode()

    code = {n for n in lab if not n.startswith("ampsafe_lab-")}  # the lab's files, less its metadata
    assert code and all(n.startswith("ampsafe_lab/") for n in code), sorted(code)[:5]
    for rel in ("ampsafe_lab/demo.py", "ampsafe_lab/workloads/heal_runs.py", "ampsafe_lab/nets/paddle/dbnet.py"):
        assert rel in lab, rel
    data = {"ampsafe_lab/workloads/data/upstream/" + rel for rel in [*SHIPPED, "SOURCES.md"]}
    assert data <= lab, sorted(data - lab)
    (lab_entry_points,) = [n for n in lab if n.endswith(".dist-info/entry_points.txt")]
    entries = zipfile.ZipFile(wheels[1]).read(lab_entry_points).decode()
    assert "[ampsafe.lab]" in entries and "demo = ampsafe_lab.demo:main" in entries


@pytest.mark.slow
def test_a_fresh_env_with_only_the_library_scans_runs_patches_and_says_the_demo_needs_the_lab(wheels, tmp_path):
    pytest.importorskip("torch")
    python, site = _fresh_env(tmp_path / "env", wheels[0])
    cli = python.parent / "ampsafe"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tiny_factory.py").write_text(FACTORY)
    env = _clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(outside))

    def run(*args, timeout=300):
        return subprocess.run([*args], cwd=outside, env=env, capture_output=True, text=True, timeout=timeout)

    probe = run(python, "-c", LIBRARY_PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["ampsafe"]).is_relative_to(site / "ampsafe") and found["lab"] is None, found
    assert found["patched"], found  # ampsafe.patch islanded the unnormalized convs

    for command in (["demo"], ["bench"], ["scan", "dbnet"]):
        proc = run(cli, *command)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()  # one line: what to install
        assert "pip install ampsafe-lab" in line and "pip install -e lab" in line, line

    scanned = run(cli, "scan", "tiny_factory:make")
    assert scanned.returncode == 0, scanned.stderr
    assert "ampsafe scan (torch" in scanned.stdout and "unnormalized" in scanned.stdout

    script = REPO / "tests" / "run" / "scripts" / "train_torch.py"
    trained = run(cli, "run", "--", str(python), str(script), "--steps", "2")
    assert trained.returncode == 0, trained.stderr
    assert "ampsafe.torch.scaler.GradScaler: 2 steps" in trained.stdout, trained.stdout


@pytest.mark.slow
def test_the_lab_wheel_beside_the_library_runs_the_demo_as_the_checkout_does(wheels, tmp_path):
    pytest.importorskip("paddle")
    python, site = _fresh_env(tmp_path / "env", *wheels)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    probe = json.loads(subprocess.check_output([python, "-c", PROBE], cwd=outside, env=env, text=True, timeout=300))
    assert Path(probe["ampsafe"]).is_relative_to(site / "ampsafe"), (probe, site)
    for key in ("dbnet", "ppyolo"):
        assert Path(probe[key]).is_relative_to(site / "ampsafe_lab"), (key, probe[key], site)
    assert not probe["bench"]

    # the library's console script reaches the lab's demo through its entry point, run outside the checkout
    subprocess.run([python.parent / "ampsafe", *_DEMO], cwd=outside, env=env, check=True, timeout=300)
    # the checkout's run, as `make demo` runs it (.venv's console script, from the repository root; a PYTHONPATH
    # that points at the checkout stays)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    repo_cli = Path(sys.executable).parent / "ampsafe"
    command = [repo_cli] if repo_cli.is_file() else [sys.executable, "-m", "ampsafe.cli"]
    kept = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
    subprocess.run([*command, *_DEMO[:-1], checkout / "out"], cwd=REPO, env=_clean_env(**kept), check=True, timeout=300)
    (wheel_loss, wheel_setup), (repo_loss, repo_setup) = _first_loss(outside), _first_loss(checkout)
    print(f"first-step loss: checkout {repo_loss!r}, wheel {wheel_loss!r}")
    assert wheel_setup == repo_setup
    assert wheel_loss == pytest.approx(repo_loss, rel=1e-6)
