"""How far each trajectory- and tolerance-dependent test sits from its edge, across CPU instruction sets and seeds.

Float32 results differ between instruction sets (oneDNN and MKL pick other kernels on AVX-512, AVX2 and SSE4),
and training near float16's edge amplifies that. Each case below runs in a subprocess under each ISA setting
(``ONEDNN_MAX_CPU_ISA`` / ``MKL_CBWR``; the brinks are rebuilt in a fresh cache per setting) for each seed, and
records the number its test depends on:

- ``reference``: DBNet's maps vs PaddleOCR's stored run (train mode relative to the map's magnitude, eval abs).
- ``dbnet_brink`` / ``frcnn_brink``: the FP32 step at which the recipe first leaves float16's range, against the
  recipe's horizon (``max_steps``), and whether every FP32 loss stayed finite.
- ``demo``: the demo recipe's native and island runs over the test's steps: overflowing steps, final scale.
- ``monitor``: the headroom-monitor test's FP32 recipe: the step it leaves float16's range, and its peak.
- ``frcnn_heal``: the frcnn heal run: forward overflows after the heal (heal's promise: none), skipped steps.

    python -m bench.bench_margins --isa default avx2 sse41 --seeds 0 1 2       # writes results/margins.{json,md}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_result

ISA = {
    "default": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"},
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "SSE4_2"},
}
CASES = ("reference", "dbnet_brink", "frcnn_brink", "demo", "monitor", "frcnn_heal")
SEEDLESS = ("reference",)
# The horizons of the tests these cases stand for (tests/test_demo.py, tests/sentinel/test_dbnet_monitor_n10.py,
# tests/heal/test_heal_frcnn.py): the demo's recipe (ampsafe_lab.demo) over 24 steps, 40 monitor steps, 10 heal steps.
DEMO_RECIPE = {"steps": 24, "lr": 1e-2, "level": "O1", "image_size": 128, "batch_size": 8}
MONITOR_STEPS = 40
FRCNN_HEAL = {"steps": 10, "init_scale": 4.0}


def case_reference(seed: int) -> dict:
    import numpy as np
    import paddle

    from ampsafe_lab.workloads.dbnet import build_model
    from ampsafe_lab.workloads.dbnet.config import load_config

    upstream = Path(os.environ.get("AMPSAFE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "upstream"
    ref = upstream / "PaddleOCR" / "reference" / "det_mv3_db"
    model = build_model(load_config(upstream / "PaddleOCR" / "configs" / "det" / "det_mv3_db.yml")["Architecture"])
    weights = np.load(ref / "state_dict.npz")
    image = paddle.to_tensor(np.load(ref / "input.npy"))
    out = {}
    for mode in ("train", "eval"):
        model.set_state_dict({k: paddle.to_tensor(weights[k]) for k in weights.files})
        model.train() if mode == "train" else model.eval()
        maps = model(image)["maps"].numpy()
        expected = np.load(ref / f"out_{mode}_maps.npy")
        names = ("shrink", "threshold", "binary") if mode == "train" else ("binary",)
        for c, name in enumerate(names):
            diff = float(np.abs(maps[:, c] - expected[:, c]).max())
            out[f"{mode}_{name}"] = {"abs": diff, "rel": diff / float(np.abs(expected[:, c]).max())}
    return out


def case_dbnet_brink(seed: int) -> dict:
    from ampsafe_lab.workloads.dbnet import brink

    rec = brink.brink_record(seed)
    return _brink_summary(rec, brink.RECIPE["max_steps"])


def case_frcnn_brink(seed: int) -> dict:
    from ampsafe_lab.workloads import frcnn_brink

    rec = frcnn_brink.brink_record(seed)
    return _brink_summary(rec, frcnn_brink.RECIPE["max_steps"])


def _brink_summary(rec: dict, horizon: int) -> dict:
    losses = [h["loss"] for h in rec.get("history", []) if "loss" in h]
    return {
        "crossed_step": rec["crossed_step"],
        "horizon": horizon,
        "first_layer": rec["first_layer"],
        "fp32_losses_finite": all(math.isfinite(x) for x in losses),
        "train_seconds": rec.get("train_seconds"),
    }


def case_demo(seed: int) -> dict:
    from ampsafe_lab.demo import run_paddle

    out = {}
    for mode in ("native", "island"):
        t = run_paddle(mode, seed=seed, **DEMO_RECIPE)
        out[mode] = {
            "overflowing": [i for i, o in enumerate(t.overflowed) if o],
            "final_scale": t.scales[-1],
            "first_loss": t.summary()["first_loss"],
            "final_loss": t.summary()["final_loss"],
        }
    return out


def case_monitor(seed: int) -> dict:
    from ampsafe_lab.workloads.dbnet.brink import FP16_MAX, train_monitor_recipe

    peaks = [max(a.values()) for a in train_monitor_recipe(seed, MONITOR_STEPS, stop_after=5)]
    crossed = next((i for i, p in enumerate(peaks) if p > FP16_MAX), None)
    return {"crossed_step": crossed, "horizon": MONITOR_STEPS, "peak": max(peaks), "peaks": [round(p) for p in peaks]}


def case_frcnn_heal(seed: int) -> dict:
    from ampsafe_lab.workloads.heal_runs import train_frcnn_heal

    run = train_frcnn_heal(**FRCNN_HEAL, seed=seed)
    heals = run["scaler"].stats.heals
    step = heals[0].step if heals else None
    return {
        "heal_steps": [h.step for h in heals],
        "skipped": run["skipped"],
        "forward_overflow_steps": [i for i, bad in enumerate(run["forward_nonfinite"]) if bad],
        "forward_overflow_after_heal": None if step is None else any(run["forward_nonfinite"][step + 1 :]),
    }


def _run_case(case: str, seed: int, isa: str, cache: Path) -> dict:
    env = dict(os.environ, **ISA[isa], AMPSAFE_CACHE=str(cache))
    code = f"import json, bench.bench_margins as m; print('RESULT ' + json.dumps(m.case_{case}({seed})))"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "seconds": round(time.perf_counter() - t0, 1)}
    return dict(json.loads(line[len("RESULT ") :]), seconds=round(time.perf_counter() - t0, 1))


def measure(isas, seeds, cases, *, cache_dirs: dict | None = None, on_row=None) -> dict:
    """Every case under every ISA setting and seed; ``cache_dirs`` maps an ISA setting to a brink cache to reuse
    (default: a fresh temporary one, so the brinks are rebuilt on that setting's kernels); ``on_row(result)``
    is called after each row (the command line writes the files as it goes)."""
    result = {"machine": machine(), "isa_settings": {k: ISA[k] for k in isas}, "rows": []}
    for isa in isas:
        given = (cache_dirs or {}).get(isa)
        with contextlib.nullcontext(given) if given else tempfile.TemporaryDirectory(prefix=f"margins-{isa}-") as cache:
            for case in cases:
                for seed in seeds[:1] if case in SEEDLESS else seeds:
                    print(f"  {isa:8s} {case:12s} seed {seed} ...", flush=True)
                    row = {"isa": isa, "case": case, "seed": seed, **_run_case(case, seed, isa, Path(cache))}
                    result["rows"].append(row)
                    if on_row:
                        on_row(result)
    return result


def _cell(case: str, r: dict) -> str:
    if "error" in r:
        return "error: " + r["error"].strip().splitlines()[-1][:120]
    if case == "reference":
        return ", ".join(f"{k} {v['abs']:.2e}" for k, v in r.items() if isinstance(v, dict))
    if case in ("dbnet_brink", "frcnn_brink"):
        return f"crossed at step {r['crossed_step']} of {r['horizon']}, FP32 losses finite: {r['fp32_losses_finite']}"
    if case == "demo":
        n, i = r["native"], r["island"]
        return (
            f"native {len(n['overflowing'])} overflowing (first {n['overflowing'][:1]}), scale {n['final_scale']:g}; "
            f"island {len(i['overflowing'])}, scale {i['final_scale']:g}"
        )
    if case == "monitor":
        return f"FP32 crossed at step {r['crossed_step']} of {r['horizon']}, peak {r['peak']:.0f}"
    return (
        f"healed at {r['heal_steps']}, forward overflow steps {r['forward_overflow_steps']}, "
        f"skipped {[i for i, s in enumerate(r['skipped']) if s]}"
    )


def markdown(result: dict) -> str:
    info = result["machine"]
    lines = [f"CPU vector extensions: {info.get('isa') or 'unknown'}. ISA settings: {result['isa_settings']}", ""]
    lines += ["| case | ISA | seed | measured | s |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['isa']} | {r['seed']} | {_cell(r['case'], r)} | {r.get('seconds')} |")
    return "\n".join(lines) + "\n"


def run(suite: str = "quick") -> None:
    """``python -m bench`` entry: every case, default and AVX2 settings; the full suite adds SSE4.1 and 3 seeds."""
    isas = ["default", "avx2"] + (["sse41"] if suite == "full" else [])
    result = measure(isas, [0, 1, 2] if suite == "full" else [0], CASES)
    write_result("margins", result, markdown(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_margins", description=__doc__.split("\n")[0])
    ap.add_argument("--isa", nargs="+", default=["default", "avx2", "sse41"], choices=sorted(ISA))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--name", default="margins", help="results file stem")
    ap.add_argument("--cache", nargs=2, action="append", metavar=("ISA", "DIR"), help="reuse DIR's brinks for ISA")
    args = ap.parse_args(argv)
    result = measure(
        args.isa,
        args.seeds,
        args.cases,
        cache_dirs=dict(args.cache or []),
        on_row=lambda r: write_result(args.name, r, markdown(r)),
    )
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
