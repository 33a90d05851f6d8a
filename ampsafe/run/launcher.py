"""``ampsafe run [--on-floor heal|raise|clamp] [--min-scale S] [--watch] [--max-skips K] [--on-bad-target raise|drop]
[--report DIR] [--emulate-fp16] [--tensorboard DIR | --no-metrics] -- python train.py ...``

Runs an unmodified training command with ampsafe in place: the frameworks' GradScalers resolve to ampsafe's
(healing at the floor by default: the user ran ampsafe to keep the run alive), every optimizer step that no
ampsafe scaler guards is guarded (a non-finite loss or gradient skips the step; :mod:`ampsafe.run.guard`),
detection targets are checked before the model sees them (:mod:`ampsafe.run.target_hooks`), and at the end a report
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
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError
from .exits import LOADED, alive, died_text
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


def format_summary(reports: list[dict], returncode: int | None = None) -> str:
    """The exit summary (:func:`ampsafe.run.report.format_summary`: the records the report reads)."""
    from .report import format_summary as summary

    return summary(reports, returncode)


def _script_args(command: list[str]) -> list[str]:
    """The arguments the script itself gets: after ``train.py`` or ``-m module``. ``python -c CODE`` has none
    (that ``-c`` is Python's own); a command that is not Python is its program and arguments."""
    if not command or not Path(command[0]).name.startswith("python"):
        return command[1:]
    rest = command[1:]
    for i, arg in enumerate(rest):
        if arg == "-c":
            return []
        if arg == "-m":
            return rest[i + 2 :]
        if not arg.startswith("-"):
            return rest[i + 1 :]
    return []


def _config_path(command: list[str]) -> Path | None:
    """The training config the script is given (``-c`` / ``--config``), whose ``ampsafe:`` section is read."""
    command = _script_args(command)
    for i, arg in enumerate(command):
        if arg in ("-c", "--config") and i + 1 < len(command):
            return Path(command[i + 1])
        for prefix in ("--config=", "-c="):
            if arg.startswith(prefix):
                return Path(arg[len(prefix) :])
    return None


def options_from_config(path: Path) -> dict:
    """The ``ampsafe:`` section of a YAML config (``{}`` when absent, or when the file is not YAML this parser
    reads: a config with the trainer's own tags still trains, and the line printed says its section was not read)."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.allow_duplicate_keys = True
    try:
        data = yaml.load(path.read_text(encoding="utf-8"))
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        print(
            f"ampsafe run: {path} could not be read as YAML ({type(exc).__name__}: {first}); an `ampsafe:` section "
            "in it is not applied, give the options on the command line",
            flush=True,
        )
        return {}
    section = data.get("ampsafe") if isinstance(data, Mapping) else None
    if section is None:
        return {}
    if not isinstance(section, Mapping):
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
        help="NaN/Inf sentinel on the trained model (from step 0; steps are optimizer steps). Under a dynamic loss "
        "scale it stops with NonFiniteError (op, module, pass, sample, kind) on a non-finite forward value, a "
        "backward overflow at the floor, or a gradient no smaller scale makes finite; routine backoffs are counted. "
        "Without a scaler, the first skipped step stops the run the same way",
    )
    parser.add_argument(
        "--max-skips",
        type=int,
        default=None,
        help="FP32 guard: stop after more than K non-finite (skipped) optimizer steps in a row (default 10; "
        "raise it to ride out a bad stretch of data)",
    )
    parser.add_argument(
        "--headroom-every",
        type=int,
        default=None,
        metavar="N",
        help="sample each scanned path's float16 headroom in every N-th optimizer step's own forward (and every "
        "step of the first N), warn once when a path's trend reaches 65504, plot it in the report (default 10; 0: off)",
    )
    parser.add_argument(
        "--no-underflow",
        dest="underflow",
        action="store_false",
        default=None,
        help="do not measure the gradients' float16 underflow on the sampled steps (measured by default: the fraction "
        "of gradient elements float16 holds as zero or subnormal, in the report and the amp/* metrics)",
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
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="every scaler of the run writes amp/loss_scale, amp/skipped_steps, ... at each optimizer step into a "
        "TensorBoard event file in DIR (a plain loop's logger; needs the tensorboard package)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        default=None,
        help="do not add the amp/* metrics to the loggers of the trainers the script builds (HF Trainer, "
        "Lightning, mmengine, ultralytics, PaddleOCR, PaddleDetection); they are added by default",
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


WRITER_WAIT_S = 30.0  # as long as torchrun gives the other ranks between its SIGTERM and its SIGKILL


def _run_command(command: list[str], env: dict) -> int:
    """The command's exit status. On Ctrl-C (which the command got too) it is given time to end and write its
    summaries, and killed only on a second Ctrl-C or after :data:`WRITER_WAIT_S`: status 130. A SIGTERM sent to
    ``ampsafe run`` alone (``kill``, a scheduler stopping the job) goes on to the command, as torchrun passes it to
    its workers: the training ends as it would have without ampsafe, instead of running on without its launcher."""
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError as exc:
        raise ConfigError(f"ampsafe run: cannot start {command[0]!r}: {exc}") from exc
    forwarding = threading.current_thread() is threading.main_thread()  # Python sets handlers there only
    previous = signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum)) if forwarding else None
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=WRITER_WAIT_S)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        return 130
    finally:
        if forwarding:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: set in C


def _wait_for_writers(report_dir: str, limit: float = WRITER_WAIT_S) -> None:
    """Wait (at most ``limit`` seconds) for every process that loaded ampsafe and has not written its summary yet
    while it still runs: a launcher may return before the ranks it started have ended (torchrun's workers run in
    sessions of their own, and outlive it when it is killed), and the reports folder goes with the run's
    temporary folder."""
    deadline = time.monotonic() + limit
    directory = Path(report_dir)
    while time.monotonic() < deadline:
        pending = [
            int(p.name[: -len(LOADED)])
            for p in directory.glob(f"*{LOADED}")
            if p.name[: -len(LOADED)].isdigit() and not (directory / f"{p.name[: -len(LOADED)]}.json").exists()
        ]
        if not any(alive(pid) for pid in pending):
            return
        time.sleep(0.1)


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
    if options.tensorboard and not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
        raise ConfigError(
            "ampsafe run --tensorboard writes event files with the tensorboard package: pip install 'ampsafe[tensorboard]'"
        )
    print(
        f"ampsafe run: torch's and Paddle's GradScalers (every spelling) -> ampsafe's scalers with "
        f"the script's arguments plus {options.scaler_text()}"
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
        returncode = _run_command(command, _child_env(options, site_dir, report_dir))
        _wait_for_writers(report_dir)
        reports = _reports(report_dir)
        loaded = bool(reports) or any(Path(report_dir).glob(f"*{LOADED}"))
    for change in sorted({c for r in reports for c in r.get("changes", [])}):
        print(f"ampsafe run: changed {change}")
    if reports:
        print(format_summary(reports, returncode), flush=True)
        _write_run_report(reports, options, command, returncode)
    elif loaded:  # every process that loaded ampsafe.auto writes one at exit, unless killed before it
        print(
            "ampsafe run: ampsafe loaded, but no process of the command wrote its summary: a process killed by a "
            "signal (or ended by os._exit) runs no exit hook",
            flush=True,
        )
    else:
        print(
            "ampsafe run: no Python process of the command loaded ampsafe (was it a Python interpreter with ampsafe "
            "installed? a Python that ignores PYTHONPATH, e.g. with -I or -E?)",
            flush=True,
        )
    if returncode < 0:
        print(f"ampsafe run: {died_text(-returncode, loaded)}", flush=True)
        return 128 - returncode  # a shell's status for a command killed by that signal
    if returncode:
        print(f"ampsafe run: the command exited with status {returncode}", flush=True)
    return returncode
