"""``ampsafe run [--on-floor raise|clamp|heal] [--min-scale S] [--watch] -- python train.py ...``

Runs an unmodified training command with ampsafe in place. The command runs as a child process (so
``torchrun`` / ``paddle.distributed.launch`` workers, ``-m`` modules and plain scripts all work) whose
``PYTHONPATH`` starts with a folder holding a ``sitecustomize.py`` that imports :mod:`ampsafe.auto` (and then
any ``sitecustomize`` the environment already had). Each Python process of the command writes a report at
exit; this prints what will change at start and a summary of every scaler at the end, and returns the
command's exit code.

Options, by precedence: the command line, then an ``ampsafe:`` section of the config the command passes with
``-c`` / ``--config`` (``on_floor``, ``min_scale``, ``watch``), then the defaults (raise at a floor of 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from .errors import ConfigError

__all__ = ["main", "options_from_config", "validate_options", "format_summary", "SITECUSTOMIZE"]

# read by ampsafe.auto in the child (this module must not import ampsafe.auto: importing it installs)
ENV_OPTIONS = "AMPSAFE_RUN_OPTIONS"  # JSON options
ENV_REPORT = "AMPSAFE_RUN_REPORT"  # a directory: each process of the command writes <pid>.json there at exit
ON_FLOOR = ("raise", "clamp", "heal")

DEFAULTS = {"on_floor": "raise", "min_scale": 1.0, "watch": False}

SITECUSTOMIZE = '''\
"""Written by `ampsafe run`: put ampsafe in place in every Python process of the command."""
import importlib, os, sys
import ampsafe.auto  # noqa: F401

# then chain to the sitecustomize this environment had, if any
_here = os.path.dirname(os.path.abspath(__file__))
_mine = sys.modules.pop("sitecustomize", None)
_path = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
try:
    importlib.import_module("sitecustomize")
except ImportError:
    pass
finally:
    sys.path[:] = _path
    if _mine is not None and "sitecustomize" not in sys.modules:
        sys.modules["sitecustomize"] = _mine
'''


def validate_options(on_floor: str = "raise", min_scale: float = 1.0, watch: bool = False, quiet: bool = False) -> dict:
    if on_floor not in ON_FLOOR:
        raise ConfigError(f"on_floor must be one of {', '.join(ON_FLOOR)}, got {on_floor!r}")
    try:
        min_scale = float(min_scale)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"min_scale must be a number, got {min_scale!r}") from exc
    if not min_scale >= 0:  # 0: no floor (the frameworks' own behaviour)
        raise ConfigError(f"min_scale must be >= 0, got {min_scale}")
    return {"on_floor": on_floor, "min_scale": min_scale, "watch": bool(watch), "quiet": bool(quiet)}


def format_summary(reports: list[dict]) -> str:
    """One line per scaler: the class used and its skipped steps / floor hits / heals."""
    lines = []
    scalers = [(r["pid"], s) for r in reports for s in r["scalers"]]
    if not scalers:
        return "ampsafe run summary: the script created no GradScaler (nothing to report)"
    lines.append(f"ampsafe run summary: {len(scalers)} GradScaler(s)")
    for pid, s in scalers:
        lines.append(
            f"  [{s['framework']}, pid {pid}] {s['class']}: {s.get('total_steps', 0)} steps, "
            f"{s.get('skipped_steps', 0)} skipped, {s.get('floor_hits', 0)} floor hits, {s.get('heals', 0)} heals, "
            f"final scale {s['scale']}"
        )
    return "\n".join(lines)


def _config_path(command: list[str]) -> Path | None:
    for i, arg in enumerate(command):
        if arg in ("-c", "--config") and i + 1 < len(command):
            return Path(command[i + 1])
        for prefix in ("--config=", "-c="):
            if arg.startswith(prefix):
                return Path(arg[len(prefix) :])
    return None


def options_from_config(path: Path) -> dict:
    """The ``ampsafe:`` section of a YAML config (``{}`` when absent or unreadable as YAML)."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.allow_duplicate_keys = True
    try:
        data = yaml.load(path.read_text(encoding="utf-8"))
    except Exception:
        return {}
    section = data.get("ampsafe") if isinstance(data, dict) else None
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: the `ampsafe:` section must be a mapping (on_floor, min_scale, watch)")
    unknown = set(section) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"{path}: unknown keys in `ampsafe:` {sorted(unknown)}; known: {', '.join(DEFAULTS)}")
    return dict(section)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ampsafe run",
        description="Run an unmodified training command with ampsafe's GradScalers and safe necks in place.",
        epilog="example: ampsafe run --on-floor clamp -- python tools/train.py -c configs/det/det_mv3_db.yml",
    )
    parser.add_argument("--on-floor", choices=ON_FLOOR, default=None, help="what a scaler does at its floor")
    parser.add_argument("--min-scale", type=float, default=None, help="the loss-scale floor (default 1.0)")
    parser.add_argument("--watch", action="store_true", default=None, help="NaN/Inf sentinel on the trained model")
    parser.add_argument("--quiet", action="store_true", help="no per-patch lines from the child")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. python train.py ...")
    return parser


def _resolve(args, command: list[str]) -> tuple[dict, str]:
    config = _config_path(command)
    from_config = options_from_config(config) if config is not None and config.is_file() else {}
    options = dict(DEFAULTS)
    options.update(from_config)
    cli = {"on_floor": args.on_floor, "min_scale": args.min_scale, "watch": args.watch}
    options.update({k: v for k, v in cli.items() if v is not None})
    source = f" (ampsafe: section of {config})" if from_config else ""
    return validate_options(options["on_floor"], options["min_scale"], options["watch"], args.quiet), source


def _child_env(options: dict, site_dir: str, report_dir: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site_dir, env.get("PYTHONPATH", "")) if p)
    env[ENV_OPTIONS] = json.dumps(options)
    env[ENV_REPORT] = report_dir
    return env


def _reports(report_dir: str) -> list[dict]:
    out = []
    for path in sorted(Path(report_dir).glob("*.json")):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("ampsafe run needs a command after --, e.g. ampsafe run -- python train.py -c config.yml")
    options, source = _resolve(args, command)
    print(
        f"ampsafe run: torch.amp / torch.cuda.amp GradScaler and paddle.amp.GradScaler -> ampsafe's scalers with "
        f"the script's arguments plus min_scale={options['min_scale']}, on_floor={options['on_floor']!r}"
        f"{', watch' if options['watch'] else ''}{source}; safe necks registered for PaddleOCR / ppdet / dbnet",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ampsafe-run-") as tmp:
        site_dir, report_dir = os.path.join(tmp, "site"), os.path.join(tmp, "reports")
        os.makedirs(site_dir)
        os.makedirs(report_dir)
        Path(site_dir, "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        try:
            returncode = subprocess.call(command, env=_child_env(options, site_dir, report_dir))
        except FileNotFoundError as exc:
            raise ConfigError(f"ampsafe run: cannot start {command[0]!r}: {exc}") from exc
        except KeyboardInterrupt:
            returncode = 130
        reports = _reports(report_dir)
    for change in sorted({c for r in reports for c in r.get("changes", [])}):
        print(f"ampsafe run: changed {change}")
    if not reports:  # every process that loaded ampsafe.auto writes one, scalers or not
        print(
            "ampsafe run: no Python process of the command loaded ampsafe (was it a Python interpreter with ampsafe "
            "installed? a Python that ignores PYTHONPATH, e.g. with -I or -E?)",
            flush=True,
        )
    else:
        print(format_summary(reports), flush=True)
    if returncode:
        print(f"ampsafe run: the command exited with status {returncode}", flush=True)
    return returncode
