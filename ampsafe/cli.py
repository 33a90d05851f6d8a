"""``ampsafe`` command line: one subcommand per job, each implemented by a module's ``main(argv) -> int``.

``demo`` and ``bench`` are the lab's (``ampsafe-lab``): their ``main`` is the lab's entry point of that name
(:mod:`ampsafe._lab`); without the lab they say in one line what to install and exit with status 1.
"""

from __future__ import annotations

import importlib
import sys

# the commands whose main(argv) is the lab's entry point of the command's name
LAB = "the lab"
# subcommand -> (module with main(argv), or LAB; one-line help)
COMMANDS = {
    "demo": (LAB, "the main job: the seed's AMP failure and its fix, side by side (needs ampsafe-lab)"),
    "scan": ("ampsafe.scan_cli", "scan WORKLOAD|module:factory for unnormalized / risky float16 paths"),
    "swap-neck": ("ampsafe.patches.swap", "rewrite a PaddleOCR/PaddleDetection config to an AMP-safe neck"),
    "run": (
        "ampsafe.run.launcher",
        "run an unmodified training script with ampsafe's scalers: ampsafe run -- python train.py",
    ),
    "plan": (
        "ampsafe.plan.cli",
        "the modules a run report healed, as an engine's float32 list: plan REPORT --to ENGINE",
    ),
    "bench": (LAB, "run the benchmark suite (quick|full) and write bench/results (needs ampsafe-lab)"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return (
        f"usage: ampsafe [--version] COMMAND [ARGS]\n\ncommands:\n{rows}\n\n"
        "'ampsafe COMMAND --help' for a command's options."
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from . import __version__

        print(f"ampsafe {__version__}")
        return 0
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"ampsafe: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from ._lab import LabNotInstalled, load
    from .errors import AmpSafeError

    where = COMMANDS[name][0]
    try:
        command = load(name, f"ampsafe {name}") if where is LAB else importlib.import_module(where).main
        return int(command(rest) or 0)
    except LabNotInstalled as exc:  # one line: what to install
        print(exc, file=sys.stderr)
        return 1
    except AmpSafeError as exc:
        print(f"ampsafe {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
