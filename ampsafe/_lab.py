"""The lab as the library sees it: entry points, never an import by name.

``pip install ampsafe`` installs the library. The reference workloads, the demo's training loops and the bench
runner are the lab, a distribution of their own (``ampsafe-lab``, ``lab/`` in the repository), which imports the
library and registers what the command line reaches in the entry-point group ``ampsafe.lab``: ``demo`` and
``bench`` (a command's ``main(argv) -> int``) and ``workloads`` (``build(name, **options)``, for ``ampsafe scan
WORKLOAD``). No module of the library names the lab's package, so the arrow runs one way.
"""

from __future__ import annotations

from importlib import metadata

from .errors import ConfigError

__all__ = ["GROUP", "INSTALL", "LabNotInstalled", "load"]

GROUP = "ampsafe.lab"
INSTALL = "pip install ampsafe-lab (in a checkout of the repository: pip install -e lab)"


class LabNotInstalled(ConfigError):
    """What was asked for is the lab's, and the lab is not installed; the message says what to install."""


def _entry_points(name: str) -> list:
    found = metadata.entry_points()
    if hasattr(found, "select"):  # Python 3.10+
        return list(found.select(group=GROUP, name=name))
    return [ep for ep in found.get(GROUP, ()) if ep.name == name]  # pragma: no cover (Python 3.9)


def load(name: str, needed_by: str):
    """The lab's entry point ``name`` (the object it names), or :class:`LabNotInstalled` naming ``needed_by``.

    An entry point whose own package does not import (metadata left behind, or the package blocked) counts as
    not installed; any other import error inside the lab is the lab's and propagates.
    """
    missing = LabNotInstalled(f"{needed_by} needs the lab, which `pip install ampsafe` does not install: {INSTALL}")
    for ep in _entry_points(name):
        try:
            return ep.load()
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != ep.value.split(".")[0]:
                raise
            raise missing from exc
    raise missing
