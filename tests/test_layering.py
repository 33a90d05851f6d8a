"""Layering: ``ampsafe.core`` stands on its own (no framework, no front end), and no import cycle exists.

The cycle checks read every ``ampsafe`` module with ``ast`` and follow its imports (absolute and relative): those
at module level (also inside a module-level ``if``/``try``), whose cycles break import order, and every import
anywhere, function bodies included, whose cycles tangle the layers even when they run late (a Backend hands
itself to its tracer and watch, which never import it back; the registry hands each Backend its run hooks).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import ampsafe

PACKAGE = Path(ampsafe.__file__).parent
BLOCK_BOTH = textwrap.dedent(
    """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "paddle"):
                raise ImportError("blocked for this test: " + name)
    sys.meta_path.insert(0, _Block())
    """
)
# what core may import from ampsafe besides itself: the exception types (a leaf: stdlib only)
CORE_MAY_IMPORT = {"ampsafe.errors"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def _module_level(tree: ast.Module):
    """Import statements that run when the module is imported (not those inside functions or classes)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                pending += handler.body


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """The ampsafe modules ``name`` imports at module level."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in known:
                out.add(sub)  # ``from pkg import submodule``
            elif target in known:
                out.add(target)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_core_module_imports_with_torch_and_paddle_blocked():
    core = sorted(n for n in _modules() if n == "ampsafe.core" or n.startswith("ampsafe.core."))
    body = f"""
    import importlib, sys
    for name in {core!r}:
        importlib.import_module(name)
    assert not any(m.split(".")[0] in ("torch", "paddle") for m in sys.modules), "a framework was imported"
    print(len({core!r}))
    """
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_BOTH + textwrap.dedent(body)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) == len(core) >= 10


def test_core_imports_nothing_from_the_front_end():
    graph = _graph()
    wrong = {
        name: sorted(t for t in targets if not t.startswith("ampsafe.core") and t not in CORE_MAY_IMPORT)
        for name, targets in graph.items()
        if name.startswith("ampsafe.core")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_core_has_no_function_level_import_of_the_front_end_either():
    for name, path in _modules().items():
        if not name.startswith("ampsafe.core"):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = node.module or ""
            if node.level:  # resolved as Python does: core's own subpackages import core's modules as ``..x``
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("ampsafe"):
                assert target.startswith("ampsafe.core") or target in CORE_MAY_IMPORT, (name, target)


def test_no_import_cycle_among_ampsafe_modules():
    graph = _graph()
    assert len(graph) > 40 and graph["ampsafe.scanner"]  # the parse found the package and its imports
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def _full_graph() -> dict[str, set[str]]:
    """Module -> the ``ampsafe`` modules it imports anywhere (function bodies included)."""
    known = _modules()
    return {
        name: {t for t in _all_imports(name, path.read_text(encoding="utf-8"), known) if t in known and t != name}
        for name, path in known.items()
    }


def test_no_import_cycle_even_through_imports_inside_functions():
    graph = _full_graph()
    assert "ampsafe.torch.trace" in graph["ampsafe.torch.backend"]  # a function-level import is an edge
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# the modules that may import the framework registry (``ampsafe._framework``): the fronts, which resolve a model's
# Backend and hand it down; everything below them is handed its Backend
REGISTRY_IMPORTERS = {
    "ampsafe",
    "ampsafe.scanner",
    "ampsafe.patching",
    "ampsafe.sentinel",
    "ampsafe.healing.attach",
    "ampsafe.policies.rewrite",  # the registered framework names only: their classes are never rewritten
    "ampsafe.cli",
}


def test_only_the_fronts_import_the_framework_registry():
    graph = _full_graph()
    importers = {name for name, targets in graph.items() if "ampsafe._framework" in targets}
    below = sorted(n for n in importers if n not in REGISTRY_IMPORTERS and not n.startswith("ampsafe.run"))
    assert not below, f"modules below the fronts import the registry: {below}"


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


# The layers, lowest first: core <- the adapters (torch, paddle), policies and healing <- the fronts. ``_framework``
# is the registry (it may import the backends). What a lower layer needs from a front (healing: scan and patch;
# a policy: scan) is handed down to it, never imported, not even inside a function. The trainer hosts stand with
# the run (it installs them; HF's fix-line trial calls patch) and are handed the run's session, never import it.
LOWER_LAYERS = ("core", "torch", "paddle", "policies", "healing")
FRONTS = ("scanner", "patching", "sentinel", "run", "hosts", "cli", "auto", "scan_cli")


def _all_imports(name: str, source: str, known: dict) -> set[str]:
    """Every ``ampsafe`` module ``name`` imports anywhere in ``source`` (function bodies included); the package
    ``ampsafe`` itself when a name is taken from it."""
    package = name if known.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "ampsafe"}
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")
            target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] != "ampsafe":
            continue
        out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
    return out


def _is_front(module: str) -> bool:
    parts = module.split(".")
    return module == "ampsafe" or (len(parts) > 1 and parts[1] in FRONTS)


def test_no_lower_layer_imports_a_front_even_inside_a_function():
    known = _modules()
    wrong = {}
    for name, path in known.items():
        if name.split(".")[1:2] and name.split(".")[1] in LOWER_LAYERS:
            fronts = sorted(t for t in _all_imports(name, path.read_text(encoding="utf-8"), known) if _is_front(t))
            if fronts:
                wrong[name] = fronts
    assert not wrong, f"lower layers import the front: {wrong}"


def test_the_trainer_hosts_never_import_the_run_that_installs_them():
    known = _modules()
    hosts = {n: p for n, p in known.items() if n == "ampsafe.hosts" or n.startswith("ampsafe.hosts.")}
    assert {"ampsafe.hosts", "ampsafe.hosts.hf", "ampsafe.hosts.lightning"} <= set(hosts)
    wrong = {
        name: sorted(
            t for t in _all_imports(name, path.read_text(encoding="utf-8"), known) if t.startswith("ampsafe.run")
        )
        for name, path in hosts.items()
    }
    assert not {k: v for k, v in wrong.items() if v}, f"hosts import the run: {wrong}"


def test_every_relative_import_stays_inside_ampsafe():
    """A relative import one level too deep (a module moved up a package) fails only when its function runs."""
    outside = []
    for name, path in _modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > len(package.split(".")):
                outside.append(f"{name}:{node.lineno}")
    assert not outside, f"relative imports beyond the ampsafe package: {outside}"


def test_the_layer_check_sees_imports_inside_functions():
    known = _modules()
    source = "def heal():\n    from ..scanner import scan\n    import ampsafe.patching\n    from .. import sentinel\n"
    found = _all_imports("ampsafe.healing.healer", source, known)
    assert {t for t in found if _is_front(t)} == {"ampsafe.scanner", "ampsafe.patching", "ampsafe.sentinel"}


# the modules every framework package has, by the same name: a Backend and its parts, and the mechanics each
# framework writes for them (see README "Adding a framework")
SHARED_MODULES = {"backend", "tensors", "swaps", "trace", "watch", "scaler", "grads", "run"}


def test_every_registered_framework_package_has_the_shared_module_names():
    from ampsafe._framework import REGISTRY

    for name in REGISTRY:
        found = {p.stem for p in (PACKAGE / name).glob("*.py")}
        assert SHARED_MODULES <= found, f"ampsafe/{name}/ lacks {sorted(SHARED_MODULES - found)}"


# The lab (``lab/``: package ``ampsafe_lab``, distribution ``ampsafe-lab``) stands above the library: it imports
# ``ampsafe``, never the other way. The library reaches ``ampsafe demo`` / ``bench`` / a workload by name through
# the lab's entry points (``ampsafe/_lab.py``), so no library module names the lab's package, not even in a string
# (``importlib.import_module("ampsafe_lab...")``) or a docstring.
LAB = "ampsafe_lab"


def _library_files() -> list[Path]:
    """The library's modules: ``ampsafe/`` and ``ampsafe.patches`` (the checkout's ``patches/`` beside it, else the
    installed one)."""
    import ampsafe.patches

    patches = PACKAGE.parent / "patches"
    patches = patches if (patches / "register.py").is_file() else Path(ampsafe.patches.__file__).parent
    return sorted(p for root in {PACKAGE, patches} for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_library_module_imports_or_names_the_lab():
    files = _library_files()
    assert len(files) > 40 and any(p.name == "cli.py" for p in files)
    imports = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found = [n for n in names if n.split(".")[0] == LAB]
            if found:
                imports[str(path)] = found
    assert not imports, f"library modules import the lab: {imports}"
    named = [str(p) for p in files if LAB in p.read_text(encoding="utf-8")]
    assert not named, f"library modules name the lab's package: {named}"


def test_the_library_has_no_lab_module_left():
    assert not (PACKAGE / "workloads").exists() and not (PACKAGE / "demo.py").exists()
    assert not (PACKAGE / "torch" / "nets").exists()
    shipped = {p.stem for p in (PACKAGE / "paddle" / "nets").glob("*.py")}
    assert shipped == {"__init__", "paddleocr_necks", "ppdet_necks"}, shipped  # the necks ampsafe.patches swaps in


def test_the_lab_imports_the_library_it_stands_on():
    import ampsafe_lab

    lab = Path(ampsafe_lab.__file__).parent
    source = (lab / "workloads" / "dbnet" / "__init__.py").read_text(encoding="utf-8")
    assert "ampsafe.errors" in _all_imports("ampsafe_lab.workloads.dbnet", source, {})
