"""The zoo's summary: one table per tree and family, from the rows bench/zoo_ppocr.py and bench/zoo_ppdet.py wrote.

    python -m bench.zoo        # writes bench/results/zoo.md from zoo-ppocr.json and zoo-ppdet.json

Each tree's own table (every config, its scan, its training rows) stays in ``zoo-<tree>.md``; this page counts them
per family so a reader sees at once which families build, which scan risky, which overflow natively and which heal.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from bench.common import RESULTS
from bench.zoo_ppdet_shim import LIMIT_EXIT

TREES = {"PaddleOCR": "zoo-ppocr", "PaddleDetection": "zoo-ppdet"}
COLUMNS = (
    "tree",
    "family",
    "rows",
    "built",
    "risky path O1",
    "risky path O2",
    "risky op O2",
    "trained",
    "stopped by the run limit",
    "native overflowed",
    "native failed",
    "healed",
    "ampsafe failed",
)


def _risky(row: dict, level: str, key: str = "risky_paths") -> bool:
    scan = (row.get("scan") or {}).get(level) or {}
    return bool(scan.get(key))


# the sweeps' own stop at their run limit: ppdet's (between steps, or its process-group timeout), PaddleOCR's SIGKILL
LIMIT_CODES = (LIMIT_EXIT, -9)


def _stopped(run: dict) -> bool:
    """A run the sweep stopped at its time limit: no verdict on the run, only on the steps it logged."""
    return run.get("returncode") in LIMIT_CODES


def _failed(run: dict) -> bool:
    """A run that exited with its own error, or logged a non-finite loss (a run whose step log has no loss, as
    PaddleOCR's CT's, is judged by its exit alone)."""
    nonfinite = run.get("loss_last") is not None and not run.get("finite", True)
    if _stopped(run):
        return nonfinite
    return bool(run.get("returncode")) or nonfinite


def _trained(row: dict) -> dict | None:
    train = row.get("train")
    return train if train and train.get("native") and train.get("ampsafe") else None


def family_counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per family: how many rows, built, risky per level, trained, overflowed, failed and healed."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COLUMNS[2:], 0))
    for row in rows:
        c = counts[row.get("family") or "?"]
        c["rows"] += 1
        c["built"] += bool(row.get("built"))
        c["risky path O1"] += _risky(row, "O1")
        c["risky path O2"] += _risky(row, "O2")
        c["risky op O2"] += _risky(row, "O2", "risky_ops")
        train = _trained(row)
        if train is None:
            continue
        native, ours = train["native"], train["ampsafe"]
        c["trained"] += 1
        c["stopped by the run limit"] += _stopped(native) or _stopped(ours)
        c["native overflowed"] += bool(native.get("overflow_steps"))
        c["native failed"] += _failed(native)
        c["healed"] += bool(ours.get("heals"))
        c["ampsafe failed"] += _failed(ours)
    return dict(counts)


def render(results: Path = RESULTS) -> str:
    lines = ["# The zoo: every config of PaddleOCR's and PaddleDetection's trees under AMP", ""]
    body = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    notes = []
    for tree, stem in TREES.items():
        path = results / f"{stem}.json"
        if not path.exists():
            notes.append(f"- {tree}: no results ({path.name} absent).")
            continue
        data = json.loads(path.read_text())
        machine = data.get("machine", {})
        notes.append(
            f"- {tree}: [{stem}.md]({stem}.md), {len(data['rows'])} rows, K = {data.get('K')} steps, "
            f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores), {machine.get('date', '?')}."
        )
        for family, c in sorted(family_counts(data["rows"]).items()):
            body.append("| " + " | ".join([tree, family, *(str(c[k]) for k in COLUMNS[2:])]) + " |")
    lines += notes + ["", *body, ""]
    lines += [
        "A row is one config (PaddleOCR: every config; PaddleDetection: one config per architecture signature, the "
        "signatures' members listed on its page). Risky path: `ampsafe.scan` found an unnormalized conv/matmul path "
        "within its margin of 65504 at that level; risky op: another float16 op (an `exp`, a division) out of range. "
        "Trained rows ran K steps of the tree's own `tools/train.py` with emulated float16, native and under "
        "`ampsafe run`; stopped: the sweep's time limit ended a run before K steps (its row says how many it ran); "
        "failed: the run exited with its own error or logged a non-finite loss. The per-tree tables give "
        "every config, its least headroom and where, and why a row did not build, scan or train.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    out = RESULTS / "zoo.md"
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
