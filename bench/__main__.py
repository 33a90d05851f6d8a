"""``python -m bench [--suite quick|full] [--only TOPIC ...]``: run every ``bench_*.py`` topic and write a summary.

Each topic writes its own ``results/<topic>.json|md``; this runner adds ``results/<suite>-<machine>-<date>.json|md``
that collects them, with the machine recorded once. Topics run one after another in subprocesses, so one
topic's threads, caches and memory never distort another's timings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, machine, machine_tag

HERE = Path(__file__).resolve().parent
# Order: cheap overhead benchmarks first, long accuracy runs last.
QUICK = ["scaler", "watch", "scan", "patch", "emulator", "steps", "dbnet", "accuracy"]
FULL_ONLY: list[str] = []


def topics(suite: str) -> list[str]:
    present = {p.stem[len("bench_") :] for p in HERE.glob("bench_*.py")}
    wanted = QUICK + (FULL_ONLY if suite == "full" else [])
    return [t for t in wanted if t in present] + sorted(present - set(wanted))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ampsafe bench", description=__doc__)
    ap.add_argument("--suite", choices=["quick", "full"], default="quick")
    ap.add_argument("--only", nargs="*", help="topics to run (default: all of the suite)")
    args = ap.parse_args(argv)
    names = args.only or topics(args.suite)
    info = machine()
    summary = {"suite": args.suite, "machine": info, "topics": {}}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] bench {name} ...", flush=True)
        t0 = time.perf_counter()
        code = f"import bench.bench_{name} as m; m.run({args.suite!r})"
        proc = subprocess.run([sys.executable, "-c", code], cwd=HERE.parent)
        took = time.perf_counter() - t0
        # Topics whose full suite differs write `<topic>-full`; the others write `<topic>` for every suite.
        result = RESULTS / f"{name}-{args.suite}.json"
        if args.suite == "quick" or not result.exists():
            result = RESULTS / f"{name}.json"
        entry = {"returncode": proc.returncode, "seconds": round(took, 1), "file": result.name}
        if proc.returncode == 0 and result.exists():
            entry["result"] = json.loads(result.read_text())
            entry["result"].pop("machine", None)
        summary["topics"][name] = entry
        print(f"    {'ok' if proc.returncode == 0 else 'FAILED'} in {took:.0f} s", flush=True)
    stem = f"{args.suite}-{machine_tag(info)}-{info['date']}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = [f"# ampsafe bench, suite {args.suite}", "", f"Machine: {info}", ""]
    md += ["| topic | status | seconds | details |", "|---|---|---|---|"]
    for name, e in summary["topics"].items():
        status = "ok" if e["returncode"] == 0 else f"failed ({e['returncode']})"
        detail = Path(e.get("file", f"{name}.json")).with_suffix(".md").name
        md.append(f"| {name} | {status} | {e['seconds']} | [{detail}]({detail}) |")
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"wrote {RESULTS / stem}.json and .md")
    return 0 if all(e["returncode"] == 0 for e in summary["topics"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
