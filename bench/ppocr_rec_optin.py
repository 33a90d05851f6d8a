"""PaddleOCR's own ``tools/train.py -c configs/rec/rec_svtrnet.yml`` (SVTR) under emulated float16 AMP.

The recognizer half of PaddleOCR issue #6632 (SVTR trains to ``CTCLoss: nan``), at a CPU size. Runs an unmodified
PaddleOCR tree (``$PADDLEOCR_SRC``, else ``shared/upstream/PaddleOCR-src``) with its runtime packages
(requirements-dev.txt). Two runs per AMP level, one epoch each, from random init, on synthetic text lines (lower-case
words and digits drawn with OpenCV's Hershey fonts, PaddleOCR's rec label format) written to a temporary folder:

* ``native``: Paddle's own GradScaler, only :func:`ampsafe.paddle.amp_emulation.install` in place, so
  ``auto_cast`` / ``decorate`` / ``GradScaler`` behave on this CPU as float16 AMP on a GPU;
* ``ampsafe``: ``ampsafe run --emulate-fp16`` with its default options (``--on-floor heal``).

The config's own model (STN_ON, SVTRNet with its Local and Global mixers, CTCHead), loss (CTCLoss), optimizer
(AdamW) and train transforms are used; ``-o`` sets the data, the CPU, AMP with a dynamic scale from 1024, the
learning rate without warmup, and the logging. The step log comes from the shim of :mod:`bench.ppocr_optin`
(its ``sitecustomize`` wraps the scaler ``tools.program.train`` receives), so both opt-in benches read the same
records: loss, scale before and after, overflow, heals.

``python -m bench.ppocr_rec_optin [--levels O1 O2]`` writes bench/results/ppocr_rec_optin.{md,json}.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench.ppocr_optin import (
    COLUMNS,
    _fmt,
    closing_lines,
    command,
    exit_note,
    heal_lines,
    launch,
    loader_options,
    optin_args,
    optin_parser,
    print_result,
    run_dirs,
    run_folder,
    run_options,
    table_head,
    write_results,
)

CONFIG = "configs/rec/rec_svtrnet.yml"
RUNS = ("native", "ampsafe")
STEPS = 24  # one epoch of STEPS * BATCH text lines
BATCH = 8
LR = 0.002  # 4x the config's 5e-4, without its 2-epoch warmup: the recipe that pushes activations hardest here
RUN_LABELS = {
    "native": "native (Paddle's GradScaler, float16 emulated)",
    "ampsafe": "`ampsafe run --emulate-fp16`",
}
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"  # the config's character set (character_dict_path empty, en)


def write_dataset(root: Path, count: int = STEPS * BATCH, seed: int = 0) -> Path:
    """``count`` synthetic text lines (32 x 100 px, 3 to 10 characters) and PaddleOCR's rec label file."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    fonts = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX)
    lines = []
    for i in range(count):
        text = "".join(rng.choice(list(CHARS), size=int(rng.integers(3, 11))))
        font = fonts[int(rng.integers(len(fonts)))]
        (w, h), base = cv2.getTextSize(text, font, 1.0, 2)
        canvas = np.full((h + base + 12, w + 16, 3), int(rng.integers(170, 256)), np.uint8)
        ink = tuple(int(c) for c in rng.integers(0, 90, size=3))
        cv2.putText(canvas, text, (8, h + 6), font, 1.0, ink, 2, cv2.LINE_AA)
        noise = rng.normal(0, 8, canvas.shape)
        canvas = np.clip(canvas + noise, 0, 255).astype(np.uint8)
        name = f"images/line_{i:04d}.png"
        cv2.imwrite(str(root / name), cv2.resize(canvas, (100, 32), interpolation=cv2.INTER_AREA))
        lines.append(f"{name}\t{text}")
    label_file = root / "train.txt"
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return label_file


def overrides(
    data: Path, out: Path, level: str, *, lr: float = LR, batch: int = BATCH, scale: float = 1024.0, epochs: int = 1
):
    """The ``-o`` options of every run (PaddleOCR's ``key=value`` with YAML values)."""
    labels = f"['{data / 'train.txt'}']"
    return [
        "Global.use_gpu=False",
        "Global.use_amp=True",
        f"Global.amp_level={level}",
        f"Global.scale_loss={scale}",
        "Global.use_dynamic_loss_scaling=True",
        "Global.pretrained_model=",
        f"Global.epoch_num={epochs}",
        "Global.cal_metric_during_train=False",
        *run_options(out),
        f"Optimizer.lr.learning_rate={lr}",
        "Optimizer.lr.warmup_epoch=0",
        "Train.dataset.name=SimpleDataSet",
        "Eval.dataset.name=SimpleDataSet",
        *loader_options(data, labels, batch),
    ]


def run_one(
    src: Path,
    work: Path,
    run: str,
    level: str,
    *,
    data: Path | None = None,
    timeout: float = 1800,
    stop_after: int | None = None,
    **recipe,
) -> dict:
    """Train once; returns the summary plus per-step records, the command and the log tail (``stop_after``: end
    after that many optimizer steps)."""
    src, work = Path(src), Path(work)
    lr, epochs = recipe.get("lr", LR), recipe.get("epochs", 1)
    more = ([] if lr == LR else [f"lr{lr:g}"]) + ([] if epochs == 1 else [f"ep{epochs}"])
    out, data = run_dirs(work, run_folder(run, level, (), stop_after, *more), data, write_dataset)
    opts = overrides(data, out, level, **recipe)
    cmd = command(run, CONFIG, opts, report=None if run == "native" else out / "report")
    head = {"run": run, "level": level, "lr": lr, "epochs": epochs}
    return launch(src, work, out, cmd, head, stop_after=stop_after, timeout=timeout)


RECIPE_NOTE = """
Recipe (every run): `-o Global.use_gpu=False Global.use_amp=True Global.amp_level=O1|O2 Global.scale_loss=1024.0
Global.use_dynamic_loss_scaling=True Global.pretrained_model= Global.epoch_num=1|3 Global.print_batch_step=1
Global.log_smooth_window=1 Global.cal_metric_during_train=False Optimizer.lr.learning_rate=LR
Optimizer.lr.warmup_epoch=0 Train.dataset.name=SimpleDataSet Train.loader.batch_size_per_card={batch}
Train.loader.num_workers=0` plus the data paths; everything else is the config's own (STN_ON + SVTRNet + CTCHead,
CTCLoss, AdamW with cosine decay, the SVTRRecAug / SVTRRecResizeImg 64x256 train transforms). {images} synthetic
text lines (32x100, 3 to 10 lower-case letters and digits, four Hershey fonts, Gaussian noise), batch {batch}, one
epoch = {steps} steps; 0-based optimizer steps. Loss and scale come from the det bench's test `sitecustomize`,
which wraps the scaler `tools.program.train` receives; its loss equals the printed one.
"""


def to_markdown(results: list[dict], machine: dict | None = None) -> str:
    lines = [
        "# PaddleOCR SVTR recognizer (rec_svtrnet) under emulated float16 AMP (opt-in run)",
        "",
        "PaddleOCR's own `tools/train.py -c configs/rec/rec_svtrnet.yml` (unmodified), random init, AdamW without "
        f"warmup at the row's lr ({LR} = 4x the config's; a larger one is a stress probe), batch {BATCH}, Paddle "
        f"GradScaler from 1024 with dynamic scaling, on {STEPS * BATCH} synthetic text lines (one epoch; three in "
        "the 72-step rows, whose cosine decay is three epochs long). Made by `python -m bench.ppocr_rec_optin "
        "--levels O2 O1 --lrs 0.002 0.02 --epochs 1 3` (`PADDLEOCR_SRC` set; combinations not run are left out).",
        *table_head(COLUMNS[0], "lr", *COLUMNS[1:], "notes"),
    ]
    for r in results:
        lines.append(
            f"| {r['level']} | {r.get('lr', LR):g} | {RUN_LABELS[r['run']]} | {r['steps']} | {r['overflowing_steps']} | "
            f"{_fmt(r['first_overflow'])} | {_fmt(r['final_scale'])} | {_fmt(r['first_loss'])} | "
            f"{_fmt(r['final_loss'])} | {r['heals']} | {exit_note(r)} |"
        )
    overflowed = [r for r in results if r["overflowing_steps"]]
    if overflowed:
        lines += ["", "Overflows:"]
        for r in overflowed:
            healed = "; ".join(", ".join(p) for p in r["healed"]) or "no heal"
            lines.append(
                f"- {r['level']} lr {r.get('lr', LR):g}, {r['steps']} steps, {r['run']}: overflowing steps "
                f"{r['overflow_at']}; final loss {_fmt(r['final_loss'])}; islanded: {healed}"
            )
            lines += [f"  - `{line}`" for line in r.get("heal_log", [])]
    else:
        lines += ["", "Nothing overflowed at this size: no run had an overflowing step (measured, not assumed)."]
    return "\n".join(lines + closing_lines(RECIPE_NOTE, machine, steps=STEPS, batch=BATCH)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = optin_parser(
        "python -m bench.ppocr_rec_optin", __doc__.split("\n")[0], levels=["O2", "O1"], out="ppocr_rec_optin", runs=RUNS
    )
    parser.add_argument("--lrs", nargs="+", type=float, default=[LR], help="learning rates (one row set each)")
    parser.add_argument("--epochs", nargs="+", type=int, default=[1], help=f"epochs of {STEPS} steps (each a row set)")
    args = optin_args(parser, argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="ppocr-rec-optin-"))
    results = []
    combos = [(lv, lr, ep, run) for lv in args.levels for lr in args.lrs for ep in args.epochs for run in args.runs]
    for level, lr, epochs, run in combos:
        more = ([] if lr == LR else [f"lr{lr:g}"]) + ([] if epochs == 1 else [f"ep{epochs}"])
        path = work / run_folder(run, level, (), None, *more) / "result.json"
        if args.collect:
            if not path.is_file():
                continue
            r = json.loads(path.read_text(encoding="utf-8"))
            if "heal_log" not in r and (path.parent / "log.txt").is_file():
                r["heal_log"] = heal_lines((path.parent / "log.txt").read_text(encoding="utf-8"))
        else:
            r = run_one(Path(args.src), work, run, level, lr=lr, epochs=epochs)
        print_result(r, f"{level} {run}")
        results.append(r)
    write_results(Path(args.out), results, to_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
