"""Outside ``ampsafe/torch/`` and ``ampsafe/paddle/``, no module imports a framework when it is imported.

Both checks cover every module of the ``ampsafe`` package, of ``ampsafe.patches`` (the repository's ``patches/``
folder, installed under that name) and of the lab (``ampsafe_lab``, ``lab/``), whose networks (``ampsafe_lab.nets``)
are its framework packages:

- read with ``ast``: no module-level ``import`` / ``from`` of a framework or a library built on one (torch,
  paddle, ppdet, transformers, ...). Module level is what runs on import: the module body and the bodies of its
  top-level ``if`` / ``try`` / ``with`` blocks and classes. An ``if TYPE_CHECKING:`` block never runs.
- run: each of those modules imports in a fresh interpreter where importing a framework raises. This also catches
  a framework reached through another module at import time (a top-level ``from ampsafe_lab.nets.paddle import
  dbnet``).

Why: ``import ampsafe``, its CLI and ``ampsafe swap-neck`` work with either framework missing, and framework code
has one home a reader can find: the framework's own package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import ampsafe
import ampsafe.patches
import ampsafe_lab

FRAMEWORKS = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "paddle",
        "paddleocr",
        "ppocr",
        "ppdet",
        "transformers",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "accelerate",
        "mmengine",
        "mmcv",
        "mmdet",
        "ultralytics",
        "timm",
    }
)
# where framework code lives: these packages (and their subpackages) may import a framework at top level
FRAMEWORK_PACKAGES = ("ampsafe.torch", "ampsafe.paddle", "ampsafe_lab.nets")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_on_import(body: list[ast.stmt]):
    """The statements of ``body`` that run when the module is imported (function bodies do not)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _run_on_import(node.body)
            yield from _run_on_import(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _run_on_import(part)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _run_on_import(node.body)


def framework_imports(source: str) -> list[tuple[int, str]]:
    """(line, imported module) for each framework import that runs when ``source`` is imported."""
    found = []
    for node in _run_on_import(ast.parse(source).body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:  # relative imports stay inside ampsafe
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FRAMEWORKS]
    return found


def modules(package: Path, name: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``package`` (imported as ``name``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((name, *parts))] = path
    return out


def checked_modules() -> dict[str, Path]:
    """Every module of ampsafe, of ampsafe.patches and of the lab outside the framework packages (in a checkout,
    ``ampsafe.patches`` is the repository's ``patches/``; in an installed wheel it sits inside ``ampsafe/``)."""
    found = {
        **modules(Path(ampsafe.__file__).parent, "ampsafe"),
        **modules(Path(ampsafe.patches.__file__).parent, "ampsafe.patches"),
        **modules(Path(ampsafe_lab.__file__).parent, "ampsafe_lab"),
    }
    return {
        name: path
        for name, path in found.items()
        if not any(name == pkg or name.startswith(pkg + ".") for pkg in FRAMEWORK_PACKAGES)
    }


def violations(found: dict[str, Path]) -> list[str]:
    return [
        f"{name} ({path}:{line}) imports {module} at top level"
        for name, path in found.items()
        for line, module in framework_imports(path.read_text(encoding="utf-8"))
    ]


def test_no_module_outside_the_framework_packages_imports_a_framework_at_top_level():
    found = checked_modules()
    assert {"ampsafe_lab.workloads.dbnet", "ampsafe.patches.paddleocr_necks", "ampsafe.patches.ppdet_necks"} <= set(
        found
    )
    assert "ampsafe_lab.nets.paddle.dbnet" not in found and "ampsafe.paddle.nets.paddleocr_necks" not in found
    assert len(found) >= 60
    assert violations(found) == []


def test_the_check_finds_a_planted_framework_import(tmp_path):
    planted = textwrap.dedent(
        """
        from __future__ import annotations
        import os, torch.nn as nn
        from typing import TYPE_CHECKING
        from paddle import nn as pnn
        from .torch import backend
        import torchmetrics, ampsafe.torch
        if TYPE_CHECKING:
            import transformers
        else:
            import lightning.pytorch
        try:
            from ppdet.core import workspace
        except ImportError:
            import timm
        class Net:
            import ultralytics
        def build():
            import mmengine
        """
    )
    assert framework_imports(planted) == [
        (3, "torch.nn"),
        (5, "paddle"),
        (11, "lightning.pytorch"),
        (13, "ppdet.core"),
        (15, "timm"),
        (17, "ultralytics"),
    ]
    # and through the file scan: outside the framework packages only
    package = tmp_path / "ampsafe"
    for rel, text in {"paddle/nets/x.py": "import paddle\n", "run/w.py": "import paddle\n", "ok.py": ""}.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    found = {
        name: path
        for name, path in modules(package, "ampsafe").items()
        if not any(name.startswith(pkg + ".") for pkg in FRAMEWORK_PACKAGES)
    }
    assert violations(found) == [f"ampsafe.run.w ({package / 'run/w.py'}:1) imports paddle at top level"]


def test_every_module_outside_the_framework_packages_imports_with_the_frameworks_blocked(tmp_path):
    names = sorted(n for n in checked_modules() if not n.endswith("__main__"))
    code = textwrap.dedent(
        f"""
        import importlib, sys
        FRAMEWORKS = {sorted(FRAMEWORKS)!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in FRAMEWORKS:
                    raise ImportError("blocked for this test: " + name)

        sys.meta_path.insert(0, Block())
        try:
            import paddle
        except ImportError:
            pass
        else:
            raise SystemExit("the block does not work: paddle imported")
        failed = []
        for name in {names!r}:
            try:
                importlib.import_module(name)
            except Exception as err:
                failed.append(f"{{name}}: {{err!r}}")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in FRAMEWORKS)
        print("\\n".join(failed + [f"framework module loaded: {{m}}" for m in loaded]) or "ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1:] == ["ok"], proc.stdout
