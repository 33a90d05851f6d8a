"""Where workloads cache what is expensive to rebuild (the brink checkpoints), keyed by their recipe.

The key hashes the recipe, so changing a recipe never loads a stale checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Union

__all__ = ["cache_dir", "recipe_key"]


def cache_dir(explicit: Union[str, Path, None] = None) -> Path:
    """``explicit``, else ``$AMPSAFE_CACHE``, else ``$XDG_CACHE_HOME/ampsafe``, else ``~/.cache/ampsafe``.

    The default never depends on where the package is installed; the repository's tests (``tests/conftest.py``)
    set ``AMPSAFE_CACHE`` to the checkout's ``.cache/ampsafe``.
    """
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("AMPSAFE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ampsafe"


def recipe_key(prefix: str, seed: int, recipe: dict) -> str:
    """``<prefix>_seed<seed>_<10 hex digits of the recipe's hash>``."""
    digest = hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    return f"{prefix}_seed{seed}_{digest}"
