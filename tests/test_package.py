"""The package itself: imports with one framework missing, public names, clear errors for bad input."""

from __future__ import annotations

import json
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
    import ampsafe_lab.workloads

    with pytest.raises(ampsafe.ConfigError, match="unknown workload 'yolo9'.*dbnet.*frcnn.*ppyolo"):
        ampsafe_lab.workloads.build("yolo9")


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


# ``ampsafe demo`` / ``bench`` / ``scan WORKLOAD`` are the lab's (``ampsafe-lab``), reached through its entry points
BLOCK_LAB = "import sys; sys.modules['ampsafe_lab'] = None\n"  # `import ampsafe_lab` fails, as without the lab
LAB_COMMANDS = """
import contextlib, io, json
from ampsafe.cli import main
out = {}
for command in (["demo"], ["bench", "--suite", "quick"], ["scan", "dbnet"]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out[command[0]] = [main(command), err.getvalue()]
print(json.dumps(out))
"""


def test_demo_bench_and_a_workload_scan_without_the_lab_say_in_one_line_what_to_install():
    proc = subprocess.run([sys.executable, "-c", BLOCK_LAB + LAB_COMMANDS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command, (status, err) in json.loads(proc.stdout).items():
        assert status == 1, (command, err)
        (line,) = err.strip().splitlines()
        assert line.startswith(f"ampsafe {command}") and "pip install ampsafe-lab" in line, line
        assert "pip install -e lab" in line, line  # the checkout's spelling


def test_demo_and_bench_run_the_labs_commands_when_the_lab_is_installed():
    import ampsafe_lab.benchcmd
    import ampsafe_lab.demo
    import ampsafe_lab.workloads
    from ampsafe._lab import load

    assert load("demo", "test") is ampsafe_lab.demo.main
    assert load("bench", "test") is ampsafe_lab.benchcmd.main
    assert load("workloads", "test") is ampsafe_lab.workloads.build
    proc = subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", "demo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ampsafe demo") and "--workload" in proc.stdout
