from __future__ import annotations

import pytest
from docs_helpers import build_site


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site, built once with ``mkdocs build --strict`` (a warning fails it)."""
    out = tmp_path_factory.mktemp("site")
    done = build_site(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out
