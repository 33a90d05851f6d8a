"""``ampsafe bench``: runs ``python -m bench`` in the source checkout that the command is run from.

The benchmark suite (``bench/``) lives in the repository beside the library, not inside the installed package,
and the library never imports it. So ``ampsafe bench`` works only inside a checkout of the ampsafe repository:
it looks for ``bench/__main__.py`` (next to ``setup.py``) in the working directory and its parents, runs
``python -m bench ARGS`` there in a subprocess, and returns its exit status. Anywhere else (an installed wheel
run outside a checkout) it fails with a ``ConfigError`` that says to clone the repository and run it there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ampsafe.errors import ConfigError

__all__ = ["find_checkout", "main"]


def find_checkout(start: Path | None = None) -> Path | None:
    """The nearest of ``start`` (default: the working directory) and its parents that holds ``bench/__main__.py``
    and ``setup.py`` (an ampsafe source checkout), or None."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "bench" / "__main__.py").is_file() and (folder / "setup.py").is_file():
            return folder
    return None


def main(argv: list[str]) -> int:
    repo = find_checkout()
    if repo is None:
        raise ConfigError(
            f"ampsafe bench runs the repository's bench/ suite, which is not part of the installed package, and "
            f"{Path.cwd()} is not inside a source checkout of ampsafe; clone the repository and run "
            "'ampsafe bench' (or 'python -m bench') from it"
        )
    return subprocess.call([sys.executable, "-m", "bench", *argv], cwd=repo)
