"""The framework-neutral front: importing it loads no framework; the registry names every policy."""

from __future__ import annotations

import subprocess
import sys


def test_importing_patching_and_policies_loads_neither_framework():
    code = (
        "import sys, ampsafe, ampsafe.patching, ampsafe.policies as p; p.names(); "
        "print('torch' in sys.modules, 'paddle' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_registry_has_one_handler_per_policy():
    # in a fresh interpreter: other test files register policies of their own (tests/patch/test_policy_configs.py)
    import subprocess
    import sys

    code = "from ampsafe.policies import names; print(','.join(names()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().split(",") == ["auto", "convbn", "island", "rescale", "rewrite"]
