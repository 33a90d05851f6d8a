"""``import ampsafe.auto``: put ampsafe in place for code you don't edit (a notebook, or ``ampsafe run``'s child).

Importing it installs with ``ampsafe run``'s options (the ``AMPSAFE_RUN_OPTIONS`` environment variable) or the
defaults; ``install(...)`` afterwards changes them. The machinery lives in :mod:`ampsafe.run.installer` (each
installation one :class:`~ampsafe.run.session.RunSession`).
"""

from .run.installer import (  # noqa: F401
    ENV_OPTIONS,
    ENV_REPORT,
    format_summary,
    install,
    installed,
    summary,
    uninstall,
)
from .run.installer import install_from_env as _install_from_env

__all__ = ["install", "uninstall", "summary", "format_summary", "installed", "ENV_OPTIONS", "ENV_REPORT"]

_install_from_env()
