"""Report types shared by ``scan``, ``patch`` and the scaler: plain data, rendered as markdown or JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field


@dataclass
class RiskPath:
    """A conv/matmul output and everything it flows into up to the ops that end it.

    ``layers``: module paths, the starting conv/matmul first, consuming modules included. ``ends``: the
    consuming module paths, or ``"<output>"`` / ``"<loss>"``. ``ops``: the ops along it as ``module:op``.
    ``normalized``: every branch ends at a normalization or bounded op. ``amax``: float32 max |activation|
    seen on the path, the outputs of the ending ops included. ``overflows_in``: ``"forward"`` (no loss scale
    fixes it), ``"backward"`` (a smaller scale does) or None. ``protected``: already an FP32 island, rescaled
    or rewritten by ``ampsafe.patch`` (``protected_by`` names the policy). ``peak``: the op whose output holds
    ``amax``.
    """

    start: str
    layers: tuple[str, ...]
    ends: tuple[str, ...]
    ops: tuple[str, ...]
    normalized: bool
    amax: float | None = None
    headroom_bits: float | None = None
    risky: bool = False
    overflows_in: str | None = None
    grad_amax: float | None = None
    start_op: str = ""
    protected_by: str | None = None
    # the op (``module:op``) whose output holds ``amax``: the starting op itself, or where another value joined
    # the path (a residual add carrying a later block's overflow), so the module that really overflows is named
    peak: str = ""

    @property
    def protected(self) -> bool:
        return self.protected_by is not None


@dataclass
class RiskOp:
    """A non-conv/matmul op that runs in low precision at the scanned level and leaves float16 range."""

    module: str
    op: str
    amax: float | None
    headroom_bits: float | None
    protected_by: str | None = None


def _fmt(x, spec=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, spec)


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


@dataclass
class ScanReport:
    """What ``ampsafe.scan`` found: every conv/matmul path and every risky low-precision op."""

    paths: list[RiskPath] = field(default_factory=list)
    risky_ops: list[RiskOp] = field(default_factory=list)
    level: str = "O1"
    target: str = "cuda"
    framework: str = ""
    margin_bits: float = 4.0
    loss_scale: float | None = None
    notes: list[str] = field(default_factory=list)
    graph: object = field(default=None, repr=False, compare=False)

    @property
    def risky(self) -> list[RiskPath]:
        return [p for p in self.paths if p.risky]

    @property
    def unnormalized(self) -> list[RiskPath]:
        return [p for p in self.paths if not p.normalized]

    def path(self, start: str) -> RiskPath:
        """The path that starts at module ``start`` (KeyError if none)."""
        for p in self.paths:
            if p.start == start:
                return p
        raise KeyError(start)

    def to_dict(self) -> dict:
        return _jsonable(
            {
                "framework": self.framework,
                "level": self.level,
                "target": self.target,
                "margin_bits": self.margin_bits,
                "loss_scale": self.loss_scale,
                "paths": [asdict(p) for p in self.paths],
                "risky_ops": [asdict(o) for o in self.risky_ops],
                "notes": list(self.notes),
            }
        )

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def to_markdown(self, *, only_unnormalized: bool = True) -> str:
        rows = [p for p in self.paths if not (only_unnormalized and p.normalized and not p.risky)]
        lines = [
            f"ampsafe scan ({self.framework}, level {self.level}, target {self.target}, "
            f"margin {self.margin_bits:g} bits): {len(self.paths)} conv/matmul paths, "
            f"{len(self.unnormalized)} unnormalized, {len(self.risky)} risky, {len(self.risky_ops)} risky ops",
            "",
            "| start | ends | normalized | fwd amax | bwd amax | headroom (bits) | risky | overflows in | protected |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in rows:
            lines.append(
                f"| {p.start} | {', '.join(p.ends)} | {'yes' if p.normalized else 'no'} | {_fmt(p.amax)} | "
                f"{_fmt(p.grad_amax)} | {_fmt(p.headroom_bits, '.1f')} | {'**yes**' if p.risky else 'no'} | "
                f"{p.overflows_in or '-'} | {p.protected_by or '-'} |"
            )
        if self.risky_ops:
            lines += ["", "| risky op | amax | headroom (bits) | protected |", "|---|---|---|---|"]
            for o in self.risky_ops:
                lines.append(
                    f"| {o.module}:{o.op} | {_fmt(o.amax)} | {_fmt(o.headroom_bits, '.1f')} | {o.protected_by or '-'} |"
                )
        for n in self.notes:
            lines.append(f"\nnote: {n}")
        return "\n".join(lines)


@dataclass
class PatchReport:
    """What ``ampsafe.patch`` changed. ``patched``: module paths changed; ``skipped``: path -> reason."""

    policy: str
    patched: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # module path -> what was done to it
    scan: ScanReport | None = field(default=None, repr=False)

    def to_markdown(self) -> str:
        lines = [f"ampsafe patch (policy {self.policy}): {len(self.patched)} modules changed", ""]
        if self.patched:
            lines += ["| module | change |", "|---|---|"]
            lines += [f"| {m} | {self.details.get(m, self.policy)} |" for m in self.patched]
        if self.skipped:
            lines += ["", "| not patched | why |", "|---|---|"]
            lines += [f"| {m} | {why} |" for m, why in self.skipped.items()]
        return "\n".join(lines)
