"""Shared fixtures for the neck / config-swap tests."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture(scope="session")
def ppdet_workspace():
    """ppdet imported once, with ampsafe's necks registered (registration is idempotent)."""
    import ampsafe.patches

    ampsafe.patches.register_paddledet()
    from ppdet.core import workspace

    return workspace


@contextlib.contextmanager
def ppdet_isolation(workspace):
    """Yields ``fresh()``: a context manager that empties ppdet's process-wide config of loaded settings
    (registrations kept) for a ``load_config``; on exit the whole config is restored as it was."""
    from ppdet.core.config.schema import SchemaDict

    g = workspace.global_config
    saved = dict(g)
    contents = {k: dict(v) for k, v in saved.items() if isinstance(v, SchemaDict)}

    @contextlib.contextmanager
    def fresh():
        for key in list(g):
            if isinstance(g[key], SchemaDict):
                dict.clear(g[key])
            else:
                del g[key]
        yield g

    try:
        yield fresh
    finally:
        g.clear()
        g.update(saved)
        for key, items in contents.items():
            dict.clear(saved[key])
            dict.update(saved[key], items)


@pytest.fixture
def isolated_ppdet(ppdet_workspace):
    """ppdet's process-wide config, restored after the test (load_config merges into it)."""
    with ppdet_isolation(ppdet_workspace) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def isolated_ppdet_module(ppdet_workspace):
    """``isolated_ppdet`` for module-scoped fixtures (models built once for a module's tests)."""
    with ppdet_isolation(ppdet_workspace) as fresh:
        yield fresh
