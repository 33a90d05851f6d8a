"""The framework-neutral dataflow graph a walker records from one real forward pass.

Adapters (``ampsafe.torch.trace``, ``ampsafe.paddle.trace``) fill a :class:`Graph`: one :class:`Node` per
op that ran, tensors as integer ids. Path analysis (``ampsafe.core.paths``) and reports are written once,
on this graph, for both frameworks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

FP16_MAX = 65504.0
# A value at or below -MASK_LIMIT is a mask's fill value (finfo(float32).min, finfo(bfloat16).min, -inf): HF's
# additive attention masks hold finfo.min. No activation a model computes gets near 2**100 without having left
# float16's range long before, so the lanes measured apart below it are what the model computes.
MASK_LIMIT = 2.0**100
# The mask rule, for every spelling: mask lanes enter a path either through a float input from off the path (an
# additive float mask, ``where(mask, x, fill_tensor)``) or through an op that writes a fill value into the lanes a
# boolean mask picks, the value given as a number (``masked_fill(bool_mask, finfo.min)``: its only float input
# is the path's own tensor). Both are measured apart (``lane_abs_max``) and do not count where the lanes end in a
# masked softmax, an exp, a bounded op or SDPA's attn_mask (``ampsafe.core.paths``).
MASK_FILL_OPS = frozenset({"masked_fill", "masked_fill_"})


class OpKind(str, Enum):
    """What an op does to the range of its input, which is all path analysis needs to know."""

    CONV = "conv"  # convolution (incl. transposed, depthwise): starts a path
    MATMUL = "matmul"  # matmul / linear / bmm / addmm: starts a path
    NORM = "norm"  # batch/group/layer/instance norm: ends a path, normalized
    BOUNDED = "bounded"  # sigmoid, tanh, softmax, hardsigmoid, ...: ends a path, normalized
    ELEMENTWISE = "elementwise"  # add, mul, concat, resample, relu, reshape, pool, ...: the path goes on
    REDUCTION = "reduction"  # sum, mean, max over axes: the path goes on
    LOSS = "loss"  # a loss function: ends a path, unnormalized
    OTHER = "other"  # anything else (indexing, comparisons, casts): the path goes on
    FILL = "fill"  # empty/empty_like/bernoulli_/uniform_/fill_...: its values do not come from its inputs' values


START_KINDS = frozenset({OpKind.CONV, OpKind.MATMUL})
NORMALIZING_KINDS = frozenset({OpKind.NORM, OpKind.BOUNDED})


@dataclass
class Node:
    """One op that ran during the trace.

    ``op`` is a canonical lower-case name (``conv2d``, ``add``, ``interpolate``, ``exp``), ``module`` the
    path of the innermost module whose forward ran it (``""`` for the root), as ``named_modules()`` /
    ``named_sublayers()`` spell it. ``low_precision`` says whether the op would compute in float16 at the
    scanned AMP level. ``amax`` is the float32 abs-max of its outputs on the data seen (None if unmeasured).
    """

    index: int
    op: str
    kind: OpKind
    module: str
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    module_type: str = ""
    shape: tuple | None = None
    dtype: str = ""
    low_precision: bool = False
    amax: float | None = None
    grad_amax: float | None = None  # abs-max of d(loss*scale)/d(output), when measured
    # abs-max over the lanes that are not a mask's fill value (see MASK_LIMIT); None when no lane was one
    lane_amax: float | None = None

    @property
    def label(self) -> str:
        """``module:op``, as reports spell an op."""
        return f"{self.module}:{self.op}"


@dataclass
class Graph:
    """The recorded dataflow: nodes in execution order and tensor ids as edges.

    ``outputs`` are the ids of tensors the model returned; ``loss`` the id of the loss tensor when a
    ``loss_fn`` was traced. ``notes`` says what the walker could not see (custom autograd functions,
    untraced branches), so a report never claims more than was recorded.
    """

    nodes: list[Node] = field(default_factory=list)
    outputs: set[int] = field(default_factory=set)
    loss: int | None = None
    framework: str = ""
    level: str = "O1"
    notes: list[str] = field(default_factory=list)

    def add(self, op: str, kind: OpKind, module: str, inputs, outputs, **info) -> Node:
        node = Node(len(self.nodes), op, kind, module, list(inputs), list(outputs), **info)
        self.nodes.append(node)
        return node

    def producers(self) -> dict[int, int]:
        """tensor id -> index of the node that produced it (the last writer, for in-place ops)."""
        out: dict[int, int] = {}
        for node in self.nodes:
            for t in node.outputs:
                out[t] = node.index
        return out

    def consumers(self) -> dict[int, list[int]]:
        """tensor id -> indices of the nodes that read it, in execution order."""
        out: dict[int, list[int]] = {}
        for node in self.nodes:
            for t in node.inputs:
                out.setdefault(t, []).append(node.index)
        return out


def headroom_bits(amax: float | None, limit: float = FP16_MAX) -> float | None:
    """log2(limit / amax): how many doublings a value can take before it overflows float16.

    Negative when it already overflows; ``inf`` for an all-zero tensor; None when unmeasured.
    """
    if amax is None:
        return None
    if amax == 0:
        return math.inf
    if not math.isfinite(amax):
        return -math.inf
    return math.log2(limit / amax)


def path_flags(kind: OpKind, in_ids, on_path: set[int]) -> tuple[bool, bool]:
    """(on a path, carries it on) for an op's outputs, as the tracers decide what to measure: a conv/matmul
    starts a path; an op fed by one is on it; a normalizing, bounded or loss op ends it (its output still
    counts for the path). A fill op (``empty_like`` then ``bernoulli_``, how dropout records) is on no path: it
    reads its input's shape, not its values, and its output before the fill is uninitialized memory."""
    if kind is OpKind.FILL:
        return False, False
    if kind in START_KINDS:
        return True, True
    fed = any(tid in on_path for tid in in_ids)
    if kind in NORMALIZING_KINDS or kind is OpKind.LOSS:
        return fed, False
    return fed, fed


def amax_value(x: float) -> float:
    """An abs-max as a Python float; NaN (a NaN was seen) counts as unbounded."""
    return math.inf if math.isnan(x) else float(x)
