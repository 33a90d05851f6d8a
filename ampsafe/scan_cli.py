"""``ampsafe scan WORKLOAD|module:factory``: :func:`ampsafe.scan` on a named workload or a factory, as a table.

A workload name and ``--paddle-inference`` build the lab's workloads (``ampsafe-lab``, reached through its
``workloads`` entry point); ``module:factory`` needs only the library.

``ampsafe scan --paddle-inference DIR``: a user's own PaddleOCR PP-OCRv4 mobile det inference folder
(``inference.pdmodel`` / ``.pdiparams`` / ``.pdiparams.info``, as ``tools/export_model.py`` writes it), its
weights in the ``ppocrv4_det`` workload's network, scanned on a rendered text page (``--size`` px).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys

from .core.scan_report import ScanReport
from .errors import ConfigError
from .scanner import scan

__all__ = ["main"]


def _lab_build(needed_by: str):
    """The lab's ``workloads.build``; without the lab a ``ConfigError`` that says what to install."""
    from ._lab import load

    return load("workloads", needed_by)


def _load_target(spec: str):
    """``(model, example_inputs, loss_fn)`` for a workload name or ``package.module:factory``."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load {spec!r}: {exc}") from exc
        made = factory()
    else:
        made = _lab_build(f"ampsafe scan {spec}")(spec)
    if hasattr(made, "model") and hasattr(made, "example_inputs"):
        return made.model, made.example_inputs
    if isinstance(made, tuple) and len(made) == 2:
        return made
    raise ConfigError(f"{spec!r} must give a Workload, or a (model, example_inputs) tuple; got {type(made).__name__}")


def _print_table(report: ScanReport, show_all: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(x, spec=".3g"):
        if x is None:
            return "-"
        if isinstance(x, float) and math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return format(x, spec)

    rows = [p for p in report.paths if show_all or not p.normalized or p.risky]
    table = Table(
        title=f"ampsafe scan ({report.framework}, {report.level}, target {report.target}): {len(report.paths)} "
        f"paths, {len(report.unnormalized)} unnormalized, {len(report.risky)} risky"
    )
    table.add_column("start", overflow="fold")
    table.add_column("ends", overflow="fold")
    for col in ("kind", "normalized", "fwd amax", "bwd amax", "headroom", "risky", "pass"):
        table.add_column(col, no_wrap=True)
    for p in rows:
        table.add_row(
            p.start,
            ", ".join(p.ends),
            p.start_op,
            "yes" if p.normalized else "no",
            fmt(p.amax),
            fmt(p.grad_amax),
            fmt(p.headroom_bits, ".1f"),
            "[bold red]yes[/]" if p.risky else "no",
            p.overflows_in or "-",
        )
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze module paths into 80 columns
        console = Console(width=160)
    console.print(table)
    if report.risky_ops:
        ops = Table(title="risky low-precision ops")
        for col in ("op", "amax", "headroom"):
            ops.add_column(col)
        for o in report.risky_ops:
            ops.add_row(f"{o.module}:{o.op}", fmt(o.amax), fmt(o.headroom_bits, ".1f"))
        console.print(ops)
    for note in report.notes:
        console.print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ampsafe scan", description="which conv/matmul paths and ops of a model would overflow float16"
    )
    parser.add_argument(
        "target", nargs="?", metavar="WORKLOAD|module:factory", help="dbnet, ppyolo, frcnn or pkg.mod:factory"
    )
    parser.add_argument(
        "--paddle-inference", metavar="DIR", help="scan a PaddleOCR PP-OCRv4 det inference model folder instead"
    )
    parser.add_argument("--size", type=int, default=640, help="page size for --paddle-inference (multiple of 32)")
    parser.add_argument("--level", default="O1", choices=["O1", "O2"])
    parser.add_argument(
        "--target", dest="amp_target", default="cuda", choices=["cuda", "cpu"], help="whose autocast lists apply"
    )
    parser.add_argument("--margin", type=float, default=4.0, help="risky below this many bits of headroom")
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    parser.add_argument("--all", action="store_true", help="list normalized paths too")
    args = parser.parse_args(argv)
    if (args.target is None) == (args.paddle_inference is None):
        parser.error("give a WORKLOAD|module:factory or --paddle-inference DIR (one of them)")
    if args.paddle_inference:
        build = _lab_build("ampsafe scan --paddle-inference")
        made = build("ppocrv4_det", model_dir=args.paddle_inference, image_size=args.size)
        model, inputs = made.model, made.example_inputs
    else:
        model, inputs = _load_target(args.target)
    report = scan(model, inputs, level=args.level, target=args.amp_target, margin_bits=args.margin)
    _print_table(report, args.all)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(report.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
