"""The package itself: imports with one framework missing, public names, clear errors for bad input."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import ampsafe

BLOCK = textwrap.dedent(
    """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == {blocked!r} or name.startswith({blocked!r} + "."):
                raise ImportError("blocked for this test: " + name)
    sys.meta_path.insert(0, _Block())
    """
)


def _run_blocked(blocked: str, body: str) -> subprocess.CompletedProcess:
    code = BLOCK.format(blocked=blocked) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("blocked", ["torch", "paddle"])
def test_import_ampsafe_works_with_one_framework_missing(blocked):
    proc = _run_blocked(
        blocked,
        """
        import ampsafe, sys
        assert {blocked!r} not in sys.modules
        print(sorted(n for n in ("torch", "paddle") if n in sys.modules))
        """.replace("{blocked!r}", repr(blocked)),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", "import ampsafe must not import any framework"


def test_missing_framework_error_names_what_to_install():
    proc = _run_blocked(
        "paddle",
        """
        import ampsafe
        from ampsafe._framework import require
        try:
            require("paddle")
        except ampsafe.MissingFrameworkError as exc:
            print("OK", exc)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK") and "pip install paddlepaddle" in proc.stdout


def test_unknown_workload_is_a_clear_config_error():
    with pytest.raises(ampsafe.ConfigError, match="unknown workload 'yolo9'.*dbnet.*frcnn.*ppyolo"):
        ampsafe.workloads.build("yolo9")


def test_a_non_model_is_refused_with_its_type_named():
    from ampsafe._framework import framework_of

    with pytest.raises(ampsafe.UnsupportedModelError, match="builtins.dict"):
        framework_of({"not": "a model"})


def test_every_error_is_an_ampsafe_error():
    for name in ("LossScaleFloorError", "NonFiniteError", "BadTargetError", "UnsupportedModelError", "ConfigError"):
        assert issubclass(getattr(ampsafe, name), ampsafe.AmpSafeError)


def test_cli_lists_commands_and_rejects_unknown_ones(capsys):
    from ampsafe.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("demo", "scan", "swap-neck", "run", "bench"):
        assert cmd in out
    assert main(["frobnicate"]) == 2
