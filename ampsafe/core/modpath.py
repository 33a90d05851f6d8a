"""Module paths, as ``named_modules()`` / ``named_sublayers()`` spell them: the one place that knows their grammar.

A module path is a dotted name relative to a root model (``"neck.in5_conv"``); the root itself is ``""``, which
is above every other path. Scan reports, patch plans, heal records and ``ampsafe run``'s report all speak in
these paths, and they ask the same questions of them (is this module inside that one, which listed modules
enclose the others, what is this path called from an outer model), so the answers live here and nowhere else.
``"neck.in5"`` is not inside ``"neck.in"``: containment follows the dots, never string prefixes.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ROOT", "parts", "join", "parent", "under", "ancestors", "outermost", "innermost"]

ROOT = ""  # the model itself


def parts(path: str) -> list[str]:
    """The attribute names that lead from the root to ``path`` (none for the root)."""
    return path.split(".") if path else []


def join(prefix: str, path: str) -> str:
    """``path`` (relative to the module at ``prefix``) relative to the outer model: ``join("model", "fc")`` is
    ``"model.fc"``; either side may be the root ``""``."""
    if not prefix:
        return path
    return f"{prefix}.{path}" if path else prefix


def parent(path: str) -> str:
    """The path of the module that holds ``path`` (``""`` for a child of the root, and for the root itself);
    also a parameter's module: ``parent("neck.conv.weight")`` is ``"neck.conv"``."""
    return path.rpartition(".")[0]


def under(path: str, ancestor: str) -> bool:
    """Whether module ``path`` is ``ancestor`` or inside it (``""``, the root, holds everything)."""
    return ancestor == ROOT or path == ancestor or path.startswith(ancestor + ".")


def ancestors(path: str) -> list[str]:
    """``path`` and every module holding it, innermost first, the root ``""`` last."""
    out = [path]
    while path:
        path = parent(path)
        out.append(path)
    return out


def outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another listed path (duplicates dropped, first-seen order kept)."""
    unique = list(dict.fromkeys(paths))
    return [p for p in unique if not any(q != p and under(p, q) for q in unique)]


def innermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those holding another listed path (duplicates dropped, first-seen order kept)."""
    unique = list(dict.fromkeys(paths))
    return [p for p in unique if not any(q != p and under(q, p) for q in unique)]
