"""PaddleOCR's own ``tools/train.py -c configs/det/det_mv3_db.yml`` under emulated float16 AMP.

Runs an unmodified PaddleOCR tree (``$PADDLEOCR_SRC``, else ``shared/upstream/PaddleOCR-src`` from
``$AMPSAFE_SHARED`` or beside the checkout) with its runtime packages (requirements-dev.txt). Three runs per AMP
level, 36 steps each, Adam at lr 0.01 from random init, 160 px crops, batch 4, on a synthetic text-detection set
written to a temporary folder in PaddleOCR's det label format:

* ``native``: Paddle's own GradScaler; only :func:`ampsafe.paddle.amp_emulation.install` is in place, so
  ``auto_cast`` / ``decorate`` / ``GradScaler`` behave on this CPU as float16 AMP on a GPU;
* ``ampsafe run --emulate-fp16`` with its default options (``--on-floor heal``);
* the config from ``ampsafe swap-neck configs/det/det_mv3_db.yml -o safe.yml`` under the same ``ampsafe run``.

PaddleOCR's log prints the loss but not the loss scale, so a ``sitecustomize`` on the child's ``PYTHONPATH``
(written by :func:`write_shim`; ``ampsafe run`` chains to it) wraps the scaler that ``tools.program.train``
receives and writes one JSON line per optimizer step: loss, scale before and after, overflow, heals. The same
file sets ``numpy.sctypes`` just before ``imgaug`` imports (imgaug 0.4.0 reads it at import and NumPy 2
removed it); nothing of PaddleOCR is edited.

``python -m bench.ppocr_optin [--levels O1 O2] `` writes bench/results/ppocr_optin.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/det/det_mv3_db.yml"
RUNS = ("native", "ampsafe", "swapped")
STEPS = 36  # one epoch of STEPS * BATCH images: enough for native O1 to pass the 1e-2 scale mark with margin
BATCH = 4
RUN_LABELS = {
    "native": "native (Paddle's GradScaler, float16 emulated)",
    "ampsafe": "`ampsafe run --emulate-fp16`",
    "swapped": "`swap-neck` config + `ampsafe run --emulate-fp16`",
}
STEPLOG_ENV = "AMPSAFE_PPOCR_STEPLOG"
STOP_ENV = "AMPSAFE_PPOCR_STOP_AFTER"

SHIM = r'''"""Test shim for PaddleOCR under NumPy 2 (written by bench/ppocr_optin.py; not part of PaddleOCR).

1. imgaug 0.4.0 reads ``numpy.sctypes`` at import; NumPy 2 removed it: set it just before imgaug imports.
2. With $AMPSAFE_PPOCR_STEPLOG set, wrap the scaler that ``tools.program.train`` receives and append one JSON
   line per optimizer step (loss, scale before/after, overflow, heals) to that file; with
   $AMPSAFE_PPOCR_STOP_AFTER=N, exit with status 0 after the N-th step.
"""
import json
import os
import sys

sys.path.append(__CHECKOUT__)  # bench.numpy2 and bench.import_hooks
from bench.import_hooks import install  # noqa: E402
from bench.numpy2 import set_sctypes  # noqa: E402


def _float(value):
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None


def _scale_of(scaler):
    get = getattr(scaler, "get_loss_scaling", None)
    return _float(get()) if callable(get) else _float(getattr(scaler, "_scale", None))


def _stats(scaler):
    """ampsafe's ScalerStats (a property; a method in older versions), None for Paddle's scaler."""
    stats = getattr(scaler, "stats", None)
    stats = stats() if callable(stats) else stats
    return stats if hasattr(stats, "overflow_steps") else None


def _instrument(scaler, path):
    state = {"step": 0, "loss": None}
    original_scale, original_minimize = scaler.scale, scaler.minimize

    def scale(var, *args, **kwargs):
        state["loss"] = _float(var)
        return original_scale(var, *args, **kwargs)

    def minimize(optimizer, *args, **kwargs):
        before = _scale_of(scaler)
        had = getattr(_stats(scaler), "overflow_steps", None)
        error = None
        try:
            out = original_minimize(optimizer, *args, **kwargs)
        except BaseException as exc:  # the step that raised (e.g. LossScaleFloorError) is recorded too
            error, out = exc, None
        found = getattr(scaler, "_found_inf", None)
        record = {
            "step": state["step"],
            "loss": state["loss"],
            "scale_before": before,
            "scale": _scale_of(scaler),
            "found_inf": None if found is None else bool(_float(found)),
            "class": type(scaler).__module__ + "." + type(scaler).__name__,
        }
        if error is not None:
            record["error"] = type(error).__name__ + ": " + str(error)[:300]
        stats = _stats(scaler)
        if stats is not None:
            record.update(
                overflow=stats.overflow_steps > had,
                overflow_steps=stats.overflow_steps,
                skipped_steps=stats.skipped_steps,
                floor_hits=stats.floor_hits,
                heals=len(stats.heals),
                healed=[list(h.paths) for h in stats.heals],
            )
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        state["step"] += 1
        state["loss"] = None
        if error is not None:
            raise error
        if state["step"] == int(os.environ.get("AMPSAFE_PPOCR_STOP_AFTER") or 0):
            sys.exit(0)  # the first N steps of the epoch: the same batches as a full run, in less time
        return out

    scaler.scale, scaler.minimize = scale, minimize


def _wrap_train(module):
    path = os.environ.get("AMPSAFE_PPOCR_STEPLOG")
    if not path:
        return
    original = module.train

    def train(*args, **kwargs):
        scaler = args[14] if len(args) > 14 else kwargs.get("scaler")
        if scaler is not None:
            _instrument(scaler, path)
        return original(*args, **kwargs)

    module.train = train


install(before={"imgaug": set_sctypes}, after={"tools.program": _wrap_train})
'''


def run_options(out: Path) -> list[str]:
    """The ``-o`` options every bench run of ``tools/train.py`` shares: a log line per step, no checkpoint and no
    evaluation within the run, the model saved under ``out``."""
    return [
        "Global.print_batch_step=1",
        "Global.log_smooth_window=1",
        "Global.save_epoch_step=100000",
        "Global.eval_batch_step=[100000,100000]",
        f"Global.save_model_dir={out / 'model'}",
    ]


def loader_options(data: Path, labels: str, batch: int) -> list[str]:
    """Train and Eval both on the synthetic set at ``data`` (label files ``labels``), ``batch`` images a step, read
    in the training process."""
    return [
        f"Train.dataset.data_dir={data}",
        f"Train.dataset.label_file_list={labels}",
        f"Train.loader.batch_size_per_card={batch}",
        "Train.loader.num_workers=0",
        "Train.loader.use_shared_memory=False",
        f"Eval.dataset.data_dir={data}",
        f"Eval.dataset.label_file_list={labels}",
        "Eval.loader.num_workers=0",
        "Eval.loader.use_shared_memory=False",
    ]


def write_shim(folder: Path) -> Path:
    """A folder holding the test ``sitecustomize.py`` (numpy.sctypes for imgaug; the per-step scaler log)."""
    folder.mkdir(parents=True, exist_ok=True)
    checkout = repr(str(Path(__file__).resolve().parents[1]))
    (folder / "sitecustomize.py").write_text(SHIM.replace("__CHECKOUT__", checkout), encoding="utf-8")
    return folder


def write_dataset(root: Path, count: int = STEPS * BATCH, size: int = 160, seed: int = 0) -> Path:
    """``count`` synthetic text images (ampsafe_lab.workloads.dbnet.data) and PaddleOCR's det label file; returns it."""
    import cv2

    from ampsafe_lab.workloads.dbnet.data import TRAIN_STREAM, sample_rng, synth_text_image

    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        image, polys = synth_text_image(sample_rng(seed, TRAIN_STREAM, i), size)
        name = f"images/synth_{i:04d}.png"
        cv2.imwrite(str(root / name), image)
        label = [
            {"transcription": f"w{i}_{k}", "points": [[int(round(x)), int(round(y))] for x, y in poly]}
            for k, poly in enumerate(polys)
        ]
        lines.append(f"{name}\t{json.dumps(label)}")
    label_file = root / "train.txt"
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return label_file


def train_transforms(src: Path, size: int = 160, *, config: str = CONFIG) -> list:
    """``config``'s own Train transforms (det_mv3_db.yml's by default) with EastRandomCropData at ``size`` px."""
    import yaml

    config = yaml.safe_load((Path(src) / config).read_text(encoding="utf-8"))
    transforms = config["Train"]["dataset"]["transforms"]
    for op in transforms:
        if "EastRandomCropData" in op:
            op["EastRandomCropData"]["size"] = [size, size]
    return transforms


def amp_options(level: str, scale: float = 1024.0) -> list[str]:
    """PaddleOCR's AMP options: ``level``, a dynamic scale from ``scale`` (its defaults are a fixed scale of 1)."""
    return [
        "Global.use_amp=True",
        f"Global.amp_level={level}",
        f"Global.scale_loss={scale}",
        "Global.use_dynamic_loss_scaling=True",
    ]


def overrides(
    src: Path,
    data: Path,
    out: Path,
    level: str,
    *,
    lr: float | None = 0.01,
    size: int = 160,
    batch: int = BATCH,
    epochs: int = 1,
    scale: float = 1024.0,
    pretrained: str | Path = "",
    config: str = CONFIG,
    single_card: bool = False,
) -> list[str]:
    """The ``-o`` options of every run (PaddleOCR's ``key=value`` with YAML values).

    ``level="fp32"``: AMP off. ``lr=None``: the config's own learning rate. ``pretrained``: weights to start from
    (default: none, random init). ``config``: whose Train transforms to crop. ``single_card``: also
    ``Global.distributed=False``."""
    import yaml

    flow = yaml.safe_dump(train_transforms(src, size, config=config), default_flow_style=True, width=1 << 20).strip()
    labels = f"['{data / 'train.txt'}']"
    return [
        "Global.use_gpu=False",
        *(["Global.distributed=False"] if single_card else []),
        *(["Global.use_amp=False"] if level == "fp32" else amp_options(level, scale)),
        f"Global.pretrained_model={pretrained}",
        f"Global.epoch_num={epochs}",
        *run_options(out),
        *([] if lr is None else [f"Optimizer.lr.learning_rate={lr}"]),
        f"Train.dataset.transforms={flow}",
        *loader_options(data, labels, batch),
    ]


NATIVE = (
    "from ampsafe.paddle import amp_emulation; amp_emulation.install(); import runpy, sys; "
    "sys.argv = ['tools/train.py'] + sys.argv[1:]; runpy.run_path('tools/train.py', run_name='__main__')"
)


def command(run: str, config: str, opts: list[str], report: Path | None = None, options: tuple = ()) -> list[str]:
    """The command line of one run (cwd: the PaddleOCR checkout); ``options``: more of ``ampsafe run``'s."""
    train = ["-c", config, "-o", *opts]
    if run == "native":
        return [sys.executable, "-c", NATIVE, *train]
    extra = ["--report", str(report)] if report is not None else []
    return [
        sys.executable,
        "-m",
        "ampsafe.cli",
        "run",
        "--emulate-fp16",
        *options,
        *extra,
        "--",
        sys.executable,
        "tools/train.py",
        *train,
    ]


def swap_config(src: Path, out: Path) -> Path:
    """``ampsafe swap-neck configs/det/det_mv3_db.yml -o OUT`` (the CLI, as a user runs it)."""
    subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", "swap-neck", str(Path(src) / CONFIG), "-o", str(out)],
        check=True,
        cwd=src,
        capture_output=True,
        text=True,
    )
    return out


_LOG_LOSS = re.compile(r"global_step: (\d+), .*?\bloss: ([-+0-9.eEnaif]+)")


def parse_log(text: str) -> dict[int, float]:
    """PaddleOCR's printed loss per global step (1-based), with log_smooth_window=1 the step's own loss."""
    return {int(m.group(1)): float(m.group(2)) for m in _LOG_LOSS.finditer(text)}


def with_printed_losses(steps: list[dict], log: str) -> list[dict]:
    """``steps`` with each step's printed loss (``log_loss``), which is also its ``loss`` where the scaled loss
    did not read as one number (CML's, DML's)."""
    printed = parse_log(log)
    for s in steps:
        s["log_loss"] = printed.get(s["step"] + 1)
        if s.get("loss") is None:
            s["loss"] = s["log_loss"]
    return steps


def summarize(steps: list[dict]) -> dict:
    """overflowing steps, first overflow (0-based optimizer step), final scale, final loss, heals."""

    def overflowed(s):
        return bool(s["overflow"]) if "overflow" in s else bool(s.get("found_inf"))

    over = [s["step"] for s in steps if overflowed(s)]
    finite = [
        s["loss"]
        for s in steps
        if s.get("loss") is not None and s["loss"] == s["loss"] and abs(s["loss"]) != float("inf")
    ]
    return {
        "steps": len(steps),
        "overflowing_steps": len(over),
        "overflow_at": over,
        "first_overflow": over[0] if over else None,
        "final_scale": steps[-1]["scale"] if steps else None,
        "min_scale": min((s["scale"] for s in steps), default=None),
        "first_loss": steps[0]["loss"] if steps else None,
        # the last loss known: a step whose loss is read from PaddleOCR's log has none when the run stopped first
        "final_loss": next((s["loss"] for s in reversed(steps) if s.get("loss") is not None), None),
        "final_finite_loss": finite[-1] if finite else None,
        "heals": steps[-1].get("heals", 0) if steps else 0,
        "healed": steps[-1].get("healed", []) if steps else [],
        "floor_hits": steps[-1].get("floor_hits", 0) if steps else 0,
        "scaler_class": steps[-1].get("class") if steps else None,
        "error": next((s["error"] for s in steps if s.get("error")), None),
    }


def heal_lines(log: str) -> list[str]:
    """The healer's own lines (``ampsafe heal at step N: islanded ... for the path(s) starting at ...``)."""
    return [line[line.index("ampsafe heal at step") :] for line in log.splitlines() if "ampsafe heal at step" in line]


def run_one(
    src: Path,
    work: Path,
    run: str,
    level: str,
    *,
    data: Path | None = None,
    timeout: float = 1800,
    options: tuple = (),
    stop_after: int | None = None,
    **recipe,
) -> dict:
    """Train once; returns the summary plus per-step records, the command and the log tail. ``options``: more of
    ``ampsafe run``'s (``--watch``); ``stop_after``: end after that many optimizer steps of the epoch."""
    src, work = Path(src), Path(work)
    out, data = run_dirs(work, run_folder(run, level, options, stop_after), data, write_dataset)
    config = str(swap_config(src, work / "det_mv3_db_safe.yml")) if run == "swapped" else CONFIG
    opts = overrides(src, data, out, level, **recipe)
    cmd = command(run, config, opts, report=None if run == "native" else out / "report", options=options)
    return launch(src, work, out, cmd, {"run": run, "level": level}, stop_after=stop_after, timeout=timeout)


def data_folder(work: Path, data: Path | None, write: Callable[[Path], object]) -> Path:
    """``data``, else ``work/data``, written by ``write`` the first time."""
    if data is None:
        data = work / "data"
        if not (data / "train.txt").is_file():
            write(data)
    return data


def run_dirs(work: Path, folder: str, data: Path | None, write: Callable[[Path], object]) -> tuple[Path, Path]:
    """``(out, data)``: the run's folder ``work/folder`` (made) and :func:`data_folder`'s data."""
    out = work / folder
    out.mkdir(parents=True, exist_ok=True)
    return out, data_folder(work, data, write)


def run_folder(run: str, level: str, options: tuple = (), stop_after: int | None = None, *more: str) -> str:
    """``<run>-<level>[-<option>...][-<steps>]``: one folder per distinct run under the work folder."""
    return "-".join([run, level, *(o.strip("-") for o in options), *more, *([f"{stop_after}"] if stop_after else [])])


def _children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (Linux's /proc; none elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process below it, by id (the whole tree found before any is killed)."""
    import signal

    todo, seen = [pid], []
    while todo:
        current = todo.pop()
        seen.append(current)
        todo += _children(current)
    for p in seen:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launch(
    src: Path, work: Path, out: Path, cmd: list[str], head: dict, *, stop_after: int | None, timeout: float
) -> dict:
    """Run ``cmd`` in the PaddleOCR tree with the test shim (step log in ``out``); the result dict (``head``
    first), also written to ``out/result.json``."""
    shim = write_shim(work / "shim")
    steplog = out / "steps.jsonl"
    steplog.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), str(ROOT), env.get("PYTHONPATH", "")) if p)
    env[STEPLOG_ENV] = str(steplog)
    env.pop(STOP_ENV, None)
    if stop_after:
        env[STOP_ENV] = str(stop_after)
    env.setdefault("OMP_NUM_THREADS", "2")
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # ``ampsafe run`` starts the trainer as its child: it goes too
        stdout, stderr = proc.communicate()
        (out / "log.txt").write_text(stdout + stderr, encoding="utf-8")
        raise
    seconds = time.time() - start
    log = stdout + stderr
    (out / "log.txt").write_text(log, encoding="utf-8")
    steps = [json.loads(line) for line in steplog.read_text().splitlines()] if steplog.is_file() else []
    with_printed_losses(steps, log)
    report = out / "report"
    result = {
        **head,
        "returncode": proc.returncode,
        "seconds": round(seconds, 1),
        "command": [str(c) for c in cmd],
        **summarize(steps),
        "per_step": steps,
        "report": json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else None,
        "report_md": (report / "report.md").read_text() if (report / "report.md").is_file() else None,
        "heal_log": heal_lines(log),
        "stdout": stdout[-20000:],
        "log_tail": log[-4000:],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def _fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


# the columns every opt-in table shares (a bench adds its own: rec an lr after the level, each its notes last)
COLUMNS = (
    "level",
    "run",
    "steps",
    "overflowing steps",
    "first overflow",
    "final scale",
    "first loss",
    "final loss",
    "heals",
)


def _notes(r: dict) -> str:
    if r.get("returncode"):
        error = (r.get("error") or "").split(":")[0]
        return f"exit {r['returncode']} after step {r['steps'] - 1}" + (f" ({error})" if error else "")
    return ""


RECIPE_NOTE = """
Recipe (every run): `-o Global.use_gpu=False Global.use_amp=True Global.amp_level=O1|O2 Global.scale_loss=1024.0
Global.use_dynamic_loss_scaling=True Global.pretrained_model= Global.epoch_num=1 Global.print_batch_step=1
Global.log_smooth_window=1 Global.save_epoch_step=100000 Global.eval_batch_step=[100000,100000]
Optimizer.lr.learning_rate=0.01 Train.loader.batch_size_per_card={batch} Train.loader.num_workers=0` plus the data
paths and the config's own Train transforms with `EastRandomCropData.size: [160, 160]` (one
`Train.dataset.transforms=[...]` value: PaddleOCR's `-o` cannot index a list). PaddleOCR's defaults are
`scale_loss: 1.0` and `use_dynamic_loss_scaling: False` (a fixed scale that can neither collapse nor recover), so
both are set, to the scale ampsafe's demo starts from. Random init is `Global.pretrained_model=` (empty).
{images} images, batch {batch}, one epoch = {steps} steps. The swapped config is `ampsafe swap-neck`'s (the safe
neck, and `exp` on `Global.amp_custom_black_list` for DBHead's step function). Loss and scale come from a test
`sitecustomize` that wraps the scaler `tools.program.train` receives; its loss equals the printed one.
"""


def table_head(*columns: str) -> list[str]:
    """A blank line, then a Markdown table's header and rule for ``columns``."""
    return ["", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]


def exit_note(r: dict) -> str:
    """``exit N`` for a run that did not exit 0, else empty."""
    return f"exit {r['returncode']}" if r.get("returncode") else ""


def machine_lines(machine: dict | None) -> list[str]:
    """The machine line a results page ends with (none without ``machine``)."""
    if not machine:
        return []
    return [
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, paddle {machine.get('paddle')}, "
        f"python {machine.get('python')}.",
    ]


def closing_lines(recipe_note: str, machine: dict | None, *, steps: int = STEPS, batch: int = BATCH) -> list[str]:
    """The recipe note and the machine line an opt-in table ends with (det and rec alike)."""
    return ["", recipe_note.format(images=steps * batch, batch=batch, steps=steps).strip(), *machine_lines(machine)]


def to_markdown(results: list[dict], machine: dict | None = None) -> str:
    lines = [
        "# PaddleOCR det_mv3_db under emulated float16 AMP (opt-in run)",
        "",
        "PaddleOCR's own `tools/train.py -c configs/det/det_mv3_db.yml` (unmodified), random init, Adam lr 0.01, "
        f"160 px crops, batch {BATCH}, Paddle GradScaler from 1024 with dynamic scaling, on {STEPS * BATCH} synthetic "
        "text images (one epoch); "
        "steps are 0-based optimizer steps. Made by `python -m bench.ppocr_optin` (`PADDLEOCR_SRC` set).",
        *table_head(*COLUMNS, "notes"),
    ]
    for r in results:
        lines.append(
            f"| {r['level']} | {RUN_LABELS[r['run']]} | {r['steps']} | {r['overflowing_steps']} | "
            f"{_fmt(r['first_overflow'])} | {_fmt(r['final_scale'])} | {_fmt(r['first_loss'])} | "
            f"{_fmt(r['final_loss'])} | {r['heals']} | {_notes(r)} |"
        )
    healed = [r for r in results if r["healed"]]
    if healed:
        lines += ["", "Healed:"]
        for r in healed:
            at = [
                s["step"]
                for i, s in enumerate(r["per_step"])
                if s.get("heals", 0) > (r["per_step"][i - 1].get("heals", 0) if i else 0)
            ]
            lines += [
                f"- {r['level']} {r['run']} at step {step}: {', '.join(paths)}" for step, paths in zip(at, r["healed"])
            ]
    return "\n".join(lines + closing_lines(RECIPE_NOTE, machine)) + "\n"


def default_src() -> str | None:
    """``$PADDLEOCR_SRC``, else the unmodified tree in the test data (``$AMPSAFE_SHARED`` or ``../shared``)."""
    if os.environ.get("PADDLEOCR_SRC"):
        return os.environ["PADDLEOCR_SRC"]
    tree = Path(os.environ.get("AMPSAFE_SHARED") or ROOT.parent / "shared") / "upstream" / "PaddleOCR-src"
    return str(tree) if (tree / "tools" / "train.py").is_file() else None


def optin_parser(prog: str, description: str, *, levels: list[str], out: str, runs=RUNS) -> argparse.ArgumentParser:
    """The options both opt-in PaddleOCR benches take (``--src --levels --runs --work --out --collect``); a bench
    adds its own before :func:`optin_args`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--src", default=default_src(), help="PaddleOCR checkout")
    parser.add_argument("--levels", nargs="+", default=levels)
    parser.add_argument("--runs", nargs="+", default=list(runs), choices=runs)
    parser.add_argument("--work", default=None, help="keep logs and per-step records here (default: a temp dir)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / out), help="OUT.md / OUT.json")
    parser.add_argument(
        "--collect", action="store_true", help="no training: write the results from WORK/<run>-<level>/result.json"
    )
    return parser


def optin_args(parser: argparse.ArgumentParser, argv: list[str] | None):
    """Parsed options; a run without a PaddleOCR tree, or ``--collect`` without ``--work``, is a usage error."""
    args = parser.parse_args(argv)
    if not args.src and not args.collect:
        parser.error("no PaddleOCR tree: set PADDLEOCR_SRC, pass --src, or set AMPSAFE_SHARED to the shared/ folder")
    if args.collect and not args.work:
        parser.error("--collect needs --work")
    return args


def print_result(r: dict, head: str) -> None:
    """One line per finished run, as the benches print it while they go."""
    print(
        f"{head}: rc {r['returncode']}, {r['steps']} steps, {r['overflowing_steps']} overflowing "
        f"(first {r['first_overflow']}), final scale {r['final_scale']}, final loss {r['final_loss']}, "
        f"heals {r['heals']} ({r['seconds']} s)",
        flush=True,
    )


def write_results(out: Path, results: list[dict], markdown: Callable[[list[dict], dict], str]) -> None:
    """``OUT.json`` (the results without their log tails, machine recorded) and ``OUT.md``, also printed."""
    from bench.common import machine

    info = machine()
    slim = [{k: v for k, v in r.items() if k not in ("log_tail", "report", "report_md", "stdout")} for r in results]
    for r in slim:
        r["command"] = [str(c) for c in r["command"]]
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "results": slim}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(results, info))
    print(markdown(results, info))


def main(argv: list[str] | None = None) -> int:
    parser = optin_parser("python -m bench.ppocr_optin", __doc__.split("\n")[0], levels=["O1", "O2"], out="ppocr_optin")
    args = optin_args(parser, argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="ppocr-optin-"))
    results = []
    for level in args.levels:
        for run in args.runs:
            if args.collect:
                path = work / f"{run}-{level}" / "result.json"
                if not path.is_file():
                    continue
                r = json.loads(path.read_text(encoding="utf-8"))
            else:
                r = run_one(Path(args.src), work, run, level)
            print_result(r, f"{level} {run}")
            results.append(r)
    write_results(Path(args.out), results, to_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
