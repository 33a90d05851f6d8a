"""``ampsafe plan REPORT.json --to ENGINE``: print the run's float32 modules in that engine's own words."""

from __future__ import annotations

import argparse
import json

from . import ENGINES, plan

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ampsafe plan",
        description="The modules an `ampsafe run` report healed, as an engine's own float32 keep list.",
    )
    parser.add_argument(
        "report", help="the report.json `ampsafe run --report DIR` wrote (or DIR), or the JSON of `ampsafe scan --json`"
    )
    parser.add_argument("--to", required=True, choices=list(ENGINES), help="the engine whose words to use")
    parser.add_argument("--onnx", default=None, help="modelopt: the exported graph, to list its exact node names")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    result = plan(args.report, args.to, onnx=args.onnx)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.to_text(), end="" if not args.json else "\n")
    return 0
