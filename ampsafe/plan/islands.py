"""What a plan reads: the modules a run healed (its ``report.json``) or a scan found risky (an ``ampsafe.scan``
result), as one :class:`Islands`.

Why two lists: a heal islands the path that overflowed, so its modules include what lies downstream (an
activation, a dropout, the next norm). HF's keep list acts on parameters and is tried on the model, so where the
run measured it (``hf_keep_in_fp32``: the modules with weights of their own whose own float32 output passed
65504, tried through ``from_pretrained(..., dtype=torch.float16)``) the plan keeps those (``measured``); every
other engine's line names the modules as the run islanded them, where no measured list exists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ..errors import ConfigError

__all__ = ["Islands", "from_report", "from_scan", "load"]


@dataclass(frozen=True)
class Islands:
    """The modules to keep in float32, as module paths relative to the model (``named_modules`` spelling).

    ``modules``: what the run islanded (heal order) or the scan's risky path starts and risky ops' modules;
    ``measured``: the run's measured HF keep list (empty when none was measured); ``framework``: ``"torch"``,
    ``"paddle"`` or ``""`` (unknown); ``source``: where they came from, for the plan's words; ``model``: the
    model's class name when the run recorded it; ``hf``: whether the model is an HF transformers model (the run
    measures HF's list for those only; None: unknown, as for a scan)."""

    modules: tuple[str, ...]
    measured: tuple[str, ...] = ()
    framework: str = ""
    source: str = ""
    model: str = ""
    hf: bool | None = None

    @property
    def keep(self) -> tuple[str, ...]:
        """The modules whose weights stay float32: the measured list when there is one, else ``modules``."""
        return self.measured or self.modules


def _ordered(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def from_report(report: Mapping[str, Any], source: str = "report.json") -> Islands:
    """The islands of one process's ``report.json`` (as :func:`ampsafe.run.report.write_reports` writes it):
    every scaler's heals, else the modules its backoff scan would island. Raises ``ConfigError`` when there are
    none (a clean run, or one whose overflow no heal or scan localized)."""
    from ..run.records import RunSummary

    try:
        summary = RunSummary.from_dict(report)
    except Exception as exc:  # noqa: BLE001 - any unreadable report is the user's input
        raise ConfigError(f"{source} is not an `ampsafe run` report ({type(exc).__name__}: {exc})") from exc
    healed, scanned, measured, framework, model, hf = [], [], [], "", "", False
    for s in summary.scalers:
        healed += [p for h in s.heal_records for p in h.paths]
        scan = s.backoff_scan
        scanned += list((scan.modules if scan else ()) or ())
        measured += list(s.hf_keep_in_fp32 or ()) + _keep_line_names(scan.hf_keep if scan else None)
        # the run measures HF's list only for an HF model: at a heal (None otherwise) or in its backoff scan
        hf = hf or s.hf_keep_in_fp32 is not None or bool(scan and (scan.hf_keep or scan.hf_keep_note))
        framework, model = framework or s.framework, model or (s.model or "")
    modules = [p for p in _ordered(healed or scanned) if p]
    if not modules:
        root = " (its heal islanded the whole model: no module to name)" if "" in healed else ""
        raise ConfigError(
            f"{source} names no module to keep in float32{root}: the run healed none and its backoff scan found "
            "none. Run the script under `ampsafe run --on-floor heal` (the default) until a heal happens, or plan "
            "from `ampsafe.scan(model, inputs)` on a batch that overflows."
        )
    how = "healed" if healed else "found by the backoff scan"
    return Islands(_ordered(modules), _ordered(measured), framework, f"{source}: the modules the run {how}", model, hf)


def _keep_line_names(line: str | None) -> list[str]:
    """The names of a backoff scan's ``model._keep_in_fp32_modules = [...]`` line (JSON after the ``=``)."""
    if not line or "=" not in line:
        return []
    try:
        names = json.loads(line.split("=", 1)[1])
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def from_scan(scan: Any, framework: str = "") -> Islands:
    """The islands of an ``ampsafe.scan`` result (its ``ScanReport``, or the JSON ``ampsafe scan --json`` writes):
    each risky path's first module (the conv/matmul an island starts at) and each risky op's module, in the
    report's order. Raises ``ConfigError`` when nothing is risky."""
    if isinstance(scan, Mapping):
        paths = [p.get("start", "") for p in scan.get("paths") or () if p.get("risky")]
        ops = [o.get("module", "") for o in scan.get("risky_ops") or ()]
        framework = framework or str(scan.get("framework") or "")
    else:
        paths, ops = [p.start for p in scan.risky], [op.module for op in scan.risky_ops]
        framework = framework or str(getattr(scan, "framework", "") or "")
    modules = [m for m in _ordered(paths + ops) if m]
    if not modules:
        raise ConfigError(
            "the scan found no risky path or op: nothing to keep in float32. Scan a batch that overflows (or a "
            "larger calibration set) before planning."
        )
    return Islands(modules, (), framework, "ampsafe.scan: the risky paths' first modules and the risky ops' modules")


def load(source: Union[str, Path, Mapping[str, Any], Islands, Any]) -> Islands:
    """An :class:`Islands` from a ``report.json`` path, its parsed dict, a ``ScanReport`` or an ``Islands``."""
    if isinstance(source, Islands):
        return source
    if hasattr(source, "risky") and hasattr(source, "risky_ops"):
        return from_scan(source)
    if isinstance(source, Mapping):
        return from_scan(source) if _is_scan(source) else from_report(source, "the report")
    path = Path(source)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise ConfigError(
            f"no report at {path}: give the report.json an `ampsafe run --report DIR` wrote (DIR/report.json, or "
            "DIR/<pid>/report.json when several processes trained)."
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}): give the report.json `ampsafe run` wrote") from exc
    if isinstance(data, Mapping) and _is_scan(data):
        return from_scan(data)
    if not isinstance(data, Mapping) or "scalers" not in data:
        raise ConfigError(
            f"{path} is neither an `ampsafe run` report (no `scalers`) nor an `ampsafe scan --json` report (no "
            "`paths`): give the report.json `ampsafe run` wrote or the JSON `ampsafe scan --json OUT` wrote"
        )
    return from_report(data, str(path))


def _is_scan(data: Mapping[str, Any]) -> bool:
    return "paths" in data and "risky_ops" in data and "scalers" not in data
