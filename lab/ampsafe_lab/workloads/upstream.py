"""Where the workloads read upstream configs: the copies shipped inside this package, or ``$AMPSAFE_SHARED``.

``ampsafe_lab/workloads/data/upstream/`` holds byte-identical copies of the few upstream config files the workloads
build from by default (PaddleOCR's ``det_mv3_db.yml``; the ``_BASE_`` chains of ppyolo's named configs), laid out
as upstream lays them out; ``data/upstream/SOURCES.md`` lists each file's repository and commit. Nothing here
reads a file outside the installed package unless ``AMPSAFE_SHARED`` names a folder: then its ``upstream/``
subfolder (the same layout, with every upstream config; the tests point it at the repository's test data) is
read instead.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PACKAGED", "upstream_root"]

PACKAGED = Path(__file__).resolve().parent / "data" / "upstream"


def upstream_root() -> Path:
    """``$AMPSAFE_SHARED/upstream`` when ``AMPSAFE_SHARED`` is set, else the package's copy (:data:`PACKAGED`)."""
    shared = os.environ.get("AMPSAFE_SHARED")
    return Path(shared) / "upstream" if shared else PACKAGED
