"""What ``ampsafe run --watch`` costs on a real trainer: torchvision's detection reference, emulated float16.

``references/detection/train.py`` (unmodified, from ``$AMPSAFE_SHARED/upstream/torchvision-references``) trains
``fasterrcnn_mobilenet_v3_large_320_fpn`` with ``--amp`` on a synthetic COCO-layout set (noise JPEGs, two boxes
each) for one epoch, under ``ampsafe run --emulate-fp16`` (float16 AMP emulated on the CPU) with and without
``--watch``: nothing overflows, so the difference is what watching costs a healthy run. Paired runs in alternating
order (machine load drifts hit both alike); the ratio is taken pair by pair and its median quoted. Whole processes
are timed (start-up, the epoch, the reference's COCO evaluation), as a user waits for them.

    python -m bench.bench_watch_reference [--pairs 3] [--images 16]

Writes bench/results/watch_reference.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import machine, write_result

SHARED = Path(os.environ.get("AMPSAFE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
REFERENCE = SHARED / "upstream" / "torchvision-references" / "detection"
MODEL = "fasterrcnn_mobilenet_v3_large_320_fpn"
BUDGET = 1.3  # --watch at most this many times an unwatched run, or the README says what it costs and why

# coco_eval.py imports torch._six, which torch 2 removed: the reference's start-up needs it, ampsafe does not
SITECUSTOMIZE = """import sys, types
_six = types.ModuleType("torch._six")
_six.string_classes = (str, bytes)
sys.modules.setdefault("torch._six", _six)
"""


def coco(root: Path, images: int) -> Path:
    """``images`` 96x96 noise JPEGs with two boxes each in the COCO layout ``train.py --dataset coco`` reads (two
    validation images), and the ``sitecustomize`` the reference's start-up needs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "annotations").mkdir(parents=True)
    for split, n in (("train", images), ("val", 2)):
        (root / f"{split}2017").mkdir()
        entries, boxes = [], []
        for i in range(n):
            name = f"{i:012d}.jpg"
            Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(root / f"{split}2017" / name)
            entries.append({"id": i + 1, "file_name": name, "width": 96, "height": 96})
            for k, (x, y, w, h) in enumerate(((8, 10, 40, 30), (50, 44, 30, 40))):
                polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
                box = {"id": len(boxes) + 1, "image_id": i + 1, "category_id": k + 1, "bbox": [x, y, w, h]}
                boxes.append({**box, "area": w * h, "iscrowd": 0, "segmentation": [polygon]})
        data = {"images": entries, "annotations": boxes, "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
        (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(data))
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return root


def _run(data: Path, work: Path, watch: bool) -> dict:
    """One ``ampsafe run --emulate-fp16 [--watch]`` of the reference: wall and CPU seconds, exit status."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(data / "site"), os.environ.get("PYTHONPATH")) if p),
    }
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", *(["--watch"] if watch else [])]
    command += ["--report", str(work / "report"), "--", sys.executable, str(REFERENCE / "train.py")]
    command += ["--data-path", str(data), "--dataset", "coco", "--model", MODEL, "--device", "cpu", "--amp"]
    command += ["--epochs", "1", "-b", "2", "--workers", "0", "--output-dir", str(work / "out")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=work, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if proc.returncode != 0:
        raise RuntimeError(
            f"ampsafe run {'--watch ' if watch else ''}failed ({proc.returncode}): {proc.stderr[-2000:]}"
        )
    summary = next((line for line in proc.stdout.splitlines() if "GradScaler:" in line), "")
    return {"wall_s": wall, "cpu_s": cpu, "summary": summary.strip()}


def measure(pairs: int, images: int) -> dict:
    if not (REFERENCE / "train.py").is_file():
        raise SystemExit(f"torchvision's detection reference not found at {REFERENCE} (set AMPSAFE_SHARED)")
    plain, watched = [], []
    with tempfile.TemporaryDirectory(prefix="ampsafe-bench-") as tmp:
        data = coco(Path(tmp) / "coco", images)
        for i in range(pairs):  # alternating order: A B, B A, ...
            for watch in (False, True) if i % 2 == 0 else (True, False):
                work = Path(tmp) / f"run{i}-{'watch' if watch else 'plain'}"
                work.mkdir()
                result = _run(data, work, watch)
                (watched if watch else plain).append(result)
                print(f"pair {i}: {'--watch' if watch else 'plain  '} {result['wall_s']:.1f} s", flush=True)
    ratios = [w["wall_s"] / p["wall_s"] for p, w in zip(plain, watched)]
    cpu_ratios = [w["cpu_s"] / p["cpu_s"] for p, w in zip(plain, watched)]
    ratio = statistics.median(ratios)
    return {
        "trainer": f"torchvision references/detection/train.py --model {MODEL} --amp, 1 epoch, batch 2, CPU",
        "command": "ampsafe run --emulate-fp16 [--watch] -- python train.py ...",
        "images": images,
        "steps": images // 2,
        "pairs": pairs,
        "plain_wall_s": [r["wall_s"] for r in plain],
        "watch_wall_s": [r["wall_s"] for r in watched],
        "plain_cpu_s": [r["cpu_s"] for r in plain],
        "watch_cpu_s": [r["cpu_s"] for r in watched],
        "ratio_per_pair": ratios,
        "ratio_median": ratio,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "budget": BUDGET,
        # judged on CPU time: on a shared machine a process's wall time carries the other processes' load
        "within_budget": statistics.median(cpu_ratios) <= BUDGET,
        "summaries": {"plain": plain[0]["summary"], "watch": watched[0]["summary"]},
    }


def to_markdown(d: dict) -> str:
    rows = "\n".join(
        f"| {i} | {pc:.1f} | {wc:.1f} | {wc / pc:.2f} | {p:.1f} | {w:.1f} | {r:.2f} |"
        for i, (pc, wc, p, w, r) in enumerate(
            zip(d["plain_cpu_s"], d["watch_cpu_s"], d["plain_wall_s"], d["watch_wall_s"], d["ratio_per_pair"])
        )
    )
    return (
        f"`ampsafe run --watch` on {d['trainer']}, {d['steps']} steps, {d['images']} synthetic images "
        f"(`python -m bench.bench_watch_reference`): whole processes, paired in alternating order.\n\n"
        "| pair | plain CPU (s) | --watch CPU (s) | CPU ratio | plain wall (s) | --watch wall (s) | wall ratio |\n"
        f"|---|---|---|---|---|---|---|\n{rows}\n\n"
        f"Median ratio **{d['cpu_ratio_median']:.2f}x** in CPU time (user + system of the whole process tree; "
        f"budget {d['budget']}x: {'within' if d['within_budget'] else 'over'}), {d['ratio_median']:.2f}x in wall "
        "time. The CPU time is the measure: on a shared machine a process's wall time carries the other "
        "processes' load (the wall ratios of one run scatter where the CPU ratios do not).\n\n"
        f"Summary lines: plain `{d['summaries']['plain']}`; --watch `{d['summaries']['watch']}`.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_watch_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--images", type=int, default=16, help="training images (steps = images / 2)")
    args = parser.parse_args(argv)
    info = machine()
    data = measure(args.pairs, args.images)
    md = to_markdown(data)
    write_result("watch_reference", {"machine": info, **data}, md)
    print(md)
    return 0


def run(suite: str = "quick") -> None:
    """The ``python -m bench`` topic (skipped, saying why, without the upstream tree)."""
    if not (REFERENCE / "train.py").is_file():
        print(f"skipped: torchvision's detection reference not found at {REFERENCE} (set AMPSAFE_SHARED)")
        return
    main([] if suite == "quick" else ["--pairs", "5"])


if __name__ == "__main__":
    raise SystemExit(main())
