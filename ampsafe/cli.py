"""``ampsafe`` command line: one subcommand per job, each implemented by a module's ``main(argv) -> int``."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with main(argv), one-line help)
COMMANDS = {
    "demo": ("ampsafe.demo", "the main job: the seed's AMP failure and its fix, side by side"),
    "scan": ("ampsafe.scan_cli", "scan WORKLOAD|module:factory for unnormalized / risky float16 paths"),
    "swap-neck": ("ampsafe.patches.swap", "rewrite a PaddleOCR/PaddleDetection config to an AMP-safe neck"),
    "run": (
        "ampsafe.run.launcher",
        "run an unmodified training script with ampsafe's scalers: ampsafe run -- python train.py",
    ),
    "bench": ("ampsafe.benchcmd", "run the benchmark suite (quick|full) and write bench/results"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: ampsafe COMMAND [ARGS]\n\ncommands:\n{rows}\n\n'ampsafe COMMAND --help' for a command's options."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"ampsafe: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from .errors import AmpSafeError

    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except AmpSafeError as exc:
        print(f"ampsafe {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
