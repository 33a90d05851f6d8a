"""Where workloads cache what is expensive to rebuild (the brink checkpoints), keyed by their recipe.

The key hashes the recipe, so changing a recipe never loads a stale checkpoint. :func:`load_or_build` builds an
entry once across processes (test workers started together wait for the first one, then load its file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union

try:
    import fcntl
except ImportError:  # not POSIX: no lock, concurrent builders each build (the file is still replaced atomically)
    fcntl = None

__all__ = ["cache_dir", "recipe_key", "load_or_build", "load_or_build_torch"]


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


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file for as long as one process builds ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as fh:
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def load_or_build(
    path: Path,
    *,
    load: Callable[[], Any],
    build: Callable[[], Any],
    save: Callable[[Any, Path], None],
    ready: Callable[[], bool] | None = None,
) -> Any:
    """``load()`` when ``path`` is cached (``ready()``, default: the file exists); else ``build()`` once,
    ``save(value, tmp)`` and move ``tmp`` into place atomically. Concurrent callers wait for the first builder."""
    ready = ready or path.is_file
    if ready():
        return load()
    with _exclusive(path):
        if ready():  # another process built it while this one waited
            return load()
        value = build()
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
        save(value, tmp)
        os.replace(tmp, path)
        return value


def load_or_build_torch(path: Path, build: Callable[[], tuple[Any, dict]]) -> tuple[Any, dict]:
    """:func:`load_or_build` for a torch checkpoint with a JSON record beside it (``path`` with ``.json``):
    ``build() -> (state, record)``; the state loads with ``weights_only=True``."""
    import torch

    meta = path.with_suffix(".json")

    def load() -> tuple[Any, dict]:
        return torch.load(path, map_location="cpu", weights_only=True), json.loads(meta.read_text())

    def save(value: tuple[Any, dict], tmp: Path) -> None:
        torch.save(value[0], tmp)
        meta.write_text(json.dumps(value[1], indent=1))

    return load_or_build(path, load=load, build=build, save=save, ready=lambda: path.is_file() and meta.is_file())
