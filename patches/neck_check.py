"""Does a built neck have an unnormalized conv/matmul path to its output? Measured on the neck's own forward.

Why measured: a list of "safe" necks written from reading sources goes stale with every upstream release and
every config flag (``norm_type``, ``encoder_type``). :func:`check_neck` runs :func:`ampsafe.scan` on the built
neck and an example input (the tensors its backbone hands it) and reads the paths off the recorded graph: a
conv/matmul whose output reaches the neck's output without a normalization or a bounded op after it is the path
that grows under float16 (the DBNet seed report), whatever the neck's code looks like.

The verdict (:class:`NeckCheck`) has three sets of layers:

* ``to_output``: their unnormalized path reaches the neck's output (the neck is unsafe when this is not empty);
* ``feeding``: unnormalized paths that end at a conv of ``to_output`` or ``feeding`` (DBFPN's lateral 1x1 convs
  feeding its 3x3 output convs): a safe variant normalizes these too;
* ``inner``: unnormalized links that end at a layer whose own path is normalized (a depthwise conv feeding a conv
  + BatchNorm, a squeeze-excite gate's first conv feeding its sigmoid-bounded second): not on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ampsafe.core.paths import LOSS, OUTPUT, UNTRACED
from ampsafe.scanner import scan

__all__ = ["NeckCheck", "check_neck"]


@dataclass(frozen=True)
class NeckCheck:
    """What :func:`check_neck` measured on one built neck. ``ops``: layer -> its conv/matmul op."""

    neck: str
    to_output: tuple[str, ...]
    feeding: tuple[str, ...]
    inner: tuple[str, ...]
    ops: dict[str, str] = field(default_factory=dict)
    normalized_paths: int = 0

    @property
    def safe(self) -> bool:
        return not self.to_output

    @property
    def unnormalized(self) -> tuple[str, ...]:
        """The layers a safe variant follows with a norm: ``to_output`` and ``feeding``."""
        return (*self.to_output, *self.feeding)

    def reason(self) -> str:
        """One line saying what was measured."""

        def kinds(layers):
            return ", ".join(sorted({self.ops[layer] for layer in layers}))

        if not self.safe:
            shown = ", ".join(self.to_output[:4]) + (", ..." if len(self.to_output) > 4 else "")
            return (
                f"{len(self.to_output)} unnormalized {kinds(self.to_output)} output(s) reach the neck's output "
                f"({shown}); {len(self.feeding)} more feed them"
            )
        text = (
            f"no conv/matmul output reaches the neck's output unnormalized ({self.normalized_paths} normalized path(s)"
        )
        if self.inner:
            text += f"; {len(self.inner)} unnormalized {kinds(self.inner)} link(s) end inside the neck, at a layer whose own output is normalized or bounded"
        return text + ")"


def check_neck(neck, example_inputs: tuple) -> NeckCheck:
    """Trace ``neck(*example_inputs)`` with :func:`ampsafe.scan` and sort its unnormalized paths (see module doc).

    ``example_inputs``: the positional arguments of the neck's forward (usually one list of feature maps). The
    neck is left as it was (mode included); its forward runs once."""
    report = scan(neck, example_inputs)
    ops = {p.start: p.start_op for p in report.paths}
    open_paths = {p.start: set(p.ends) for p in report.paths if not p.normalized}
    to_output = [s for s, ends in open_paths.items() if ends & {OUTPUT, LOSS, UNTRACED}]
    reached = set(to_output)
    feeding: list[str] = []
    grown = True
    while grown:  # close backwards: a path that ends at a layer already on the way out is on it too
        grown = False
        for start, ends in open_paths.items():
            if start not in reached and ends & reached:
                reached.add(start)
                feeding.append(start)
                grown = True
    inner = [s for s in open_paths if s not in reached]
    return NeckCheck(
        neck=type(neck).__name__,
        to_output=tuple(to_output),
        feeding=tuple(feeding),
        inner=tuple(inner),
        ops=ops,
        normalized_paths=sum(1 for p in report.paths if p.normalized),
    )
