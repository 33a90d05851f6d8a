"""An --emulate-fp16 integration meeting a framework version it does not know says so in one line and changes
nothing; it never raises into the user's import."""

from __future__ import annotations

import types

import pytest

from ampsafe import hosts as integrations


@pytest.mark.parametrize("name, target", integrations.targets())
def test_a_version_without_the_patched_attributes_gets_one_warning_line(name, target):
    stand_in = types.ModuleType(target)  # a release where the attributes the integration patches are gone
    patched = []
    line = integrations.apply(name, stand_in, lambda *a: patched.append(a), lambda _line: None)
    assert line.startswith(f"warning: --emulate-fp16 {name} integration not installed: {target}")
    assert "\n" not in line and not patched
