"""``ampsafe run [--on-floor heal|raise|clamp] [--min-scale S] [--watch] [--max-skips K] [--on-bad-target raise|drop]
[--report DIR] [--emulate-fp16] -- python train.py ...``

Runs an unmodified training command with ampsafe in place: the frameworks' GradScalers resolve to ampsafe's
(healing at the floor by default: the user ran ampsafe to keep the run alive), every optimizer step that no
ampsafe scaler guards is guarded (a non-finite loss or gradient skips the step; :mod:`ampsafe.run.guard`),
detection targets are checked before the model sees them (:mod:`ampsafe.run.targets`), and at the end a report
says what to change so that the next run needs no healing (:mod:`ampsafe.run.report`). The command runs as a child process (so
``torchrun`` / ``paddle.distributed.launch`` workers, ``-m`` modules and plain scripts all work) whose
``PYTHONPATH`` starts with a folder holding a ``sitecustomize.py`` that imports :mod:`ampsafe.auto` (and then
any ``sitecustomize`` the environment already had). Each Python process of the command writes a report at
exit; this prints what will change at start and a summary of every scaler at the end, and returns the
command's exit code.

Options, by precedence: the command line, then an ``ampsafe:`` section of the config the command passes with
``-c`` / ``--config`` (the keys of :data:`DEFAULTS`), then the defaults: heal at a floor of 1.0, stop after more
than 10 skipped steps in a row, raise on a bad target, report into ``./ampsafe-run/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import ConfigError
from .options import DEFAULT_REPORT_DIR, ENV_OPTIONS, ENV_REPORT, ON_BAD_TARGET, ON_FLOOR, RunOptions

__all__ = ["main", "options_from_config", "format_summary", "SITECUSTOMIZE", "RunOptions", "ENV_OPTIONS", "ENV_REPORT"]

# ENV_OPTIONS / ENV_REPORT are read by ampsafe.auto in the child (this module must not import ampsafe.auto:
# importing it installs)
DEFAULTS = {k: v for k, v in RunOptions().to_dict().items() if k != "quiet"}  # what an `ampsafe:` section may set

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


def _disabled_text(reason: str) -> str:
    return reason if reason.startswith("disabled") else f"disabled ({reason})"


def format_summary(reports: list[dict]) -> str:
    """One line per scaler (its steps / skipped / floor hits / heals, or why it was disabled), one per FP32
    guard that saw steps, and the bad detection targets."""
    lines = []
    scalers = [(r["pid"], s) for r in reports for s in r["scalers"]]
    guards = [(r["pid"], g) for r in reports for g in r.get("guards", []) if g.get("total_steps")]
    targets = [(r["pid"], t) for r in reports for t in r.get("targets", []) if t.get("bad_boxes")]
    if scalers:
        lines.append(f"ampsafe run summary: {len(scalers)} GradScaler(s)")
    elif guards:
        lines.append("ampsafe run summary: the script created no GradScaler; its optimizer steps were guarded")
    elif any(g.get("unchecked_steps") for r in reports for g in r.get("guards", [])):
        n = sum(g.get("unchecked_steps", 0) for r in reports for g in r.get("guards", []))
        lines.append(
            f"ampsafe run summary: no GradScaler; {n} optimizer steps ran and none was checked by ampsafe "
            "(their optimizer's step is not a torch.optim.Optimizer step the guard wraps)"
        )
    else:
        lines.append("ampsafe run summary: no GradScaler and no optimizer step (nothing was guarded)")
    for pid, s in scalers:
        head = f"  [{s['framework']}, pid {pid}] {s['class']}: "
        if s.get("disabled_reason"):
            guarded = " (its optimizer steps went through the FP32 guard)" if guards else ""
            lines.append(head + _disabled_text(s["disabled_reason"]) + guarded)
            continue
        lines.append(
            head + f"{s.get('total_steps', 0)} steps, {s.get('skipped_steps', 0)} skipped, "
            f"{s.get('floor_hits', 0)} floor hits, {s.get('heals', 0)} heals, final scale {s['scale']}"
        )
    for pid, g in guards:
        last = f" (steps {', '.join(map(str, g['skipped_at'][:8]))})" if g.get("skipped_at") else ""
        lines.append(
            f"  [{g['framework']}, pid {pid}] FP32 guard on {g.get('model') or 'the optimizer'}: "
            f"{g['total_steps']} optimizer steps, {g['skipped_steps']} skipped (non-finite loss or gradients){last}"
        )
    for pid, t in targets:
        lines.append(
            f"  [{t['where']}, pid {pid}] {t['bad_boxes']} bad box(es) in {t['calls']} batch(es) checked "
            f"({t['policy']}): {t['first']}"
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
    section = {k.replace("-", "_"): v for k, v in section.items()}
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
    parser.add_argument(
        "--on-floor", choices=ON_FLOOR, default=None, help="what a scaler does at its floor (default heal)"
    )
    parser.add_argument("--min-scale", type=float, default=None, help="the loss-scale floor (default 1.0)")
    parser.add_argument(
        "--watch",
        action="store_true",
        default=None,
        help="NaN/Inf sentinel on the trained model; without a scaler, the first non-finite step stops the run "
        "with NonFiniteError (op, module, pass, sample, kind)",
    )
    parser.add_argument(
        "--max-skips",
        type=int,
        default=None,
        help="FP32 guard: stop after more than K non-finite (skipped) optimizer steps in a row (default 10; "
        "raise it to ride out a bad stretch of data)",
    )
    parser.add_argument(
        "--on-bad-target",
        choices=ON_BAD_TARGET,
        default=None,
        help="a degenerate / non-finite / out-of-image detection box: raise before the forward (default), or "
        "drop the box and its label and go on",
    )
    parser.add_argument(
        "--report",
        metavar="DIR",
        default=None,
        help=f"where report.md, report.json and scale.png go (default ./{DEFAULT_REPORT_DIR}/)",
    )
    # --emulate-fp16: the emulators are another module's (ampsafe.torch.cuda_emulation, ampsafe.paddle.amp_emulation)
    parser.add_argument(
        "--emulate-fp16",
        action="store_true",
        default=None,
        help="on a CPU, torch autocast('cuda') / torch.cuda.amp and Paddle auto_cast / decorate / GradScaler "
        "behave as float16 AMP on a GPU",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-patch lines from the child")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. python train.py ...")
    return parser


def _resolve(args, command: list[str]) -> tuple[RunOptions, str]:
    config = _config_path(command)
    from_config = options_from_config(config) if config is not None and config.is_file() else {}
    source = f" (ampsafe: section of {config})" if from_config else ""
    return RunOptions.from_cli(args, from_config), source


def _child_env(options: RunOptions, site_dir: str, report_dir: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site_dir, env.get("PYTHONPATH", "")) if p)
    env[ENV_OPTIONS] = options.to_env()
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


def _write_run_report(reports: list[dict], options: RunOptions, command: list[str], returncode: int) -> None:
    """``--report DIR``: report.md / report.json / scale.png per process, and where they are."""
    if not options.report:
        return
    from .report import write_reports

    try:
        run_args = ["--emulate-fp16"] if options.emulate_fp16 else []  # what the next run needs again
        written = write_reports(
            reports,
            Path(options.report),
            config=_config_path(command),
            command=command,
            run_args=run_args,
            returncode=returncode,
        )
    except OSError as exc:
        print(f"ampsafe run: could not write the report into {options.report}: {exc}", flush=True)
        return
    for path, headline in written:
        print(f"ampsafe run: report {path}: {headline}", flush=True)


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
        f"the script's arguments plus {options.scaler_text('torch')}"
        f"{', watch' if options.watch else ''}{source}; other optimizer steps guarded (max_skips="
        f"{options.max_skips}); detection targets checked (on_bad_target={options.on_bad_target!r})"
        f"{'; float16 emulated on the CPU' if options.emulate_fp16 else ''}; safe necks registered for "
        "PaddleOCR / ppdet",
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
        print(format_summary(reports, returncode), flush=True)
        _write_run_report(reports, options, command, returncode)
    if returncode:
        print(f"ampsafe run: the command exited with status {returncode}", flush=True)
    return returncode
