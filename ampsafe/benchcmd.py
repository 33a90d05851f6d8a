"""``ampsafe bench``: runs the repository's ``bench`` package (it lives beside the library, not inside it)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .errors import ConfigError


def main(argv: list[str]) -> int:
    repo = Path(__file__).resolve().parents[1]
    if not (repo / "bench" / "__main__.py").exists():
        raise ConfigError("ampsafe bench needs a source checkout of ampsafe (the bench/ folder); clone the repository")
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    return importlib.import_module("bench.__main__").main(argv)
