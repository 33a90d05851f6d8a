"""Path analysis on a recorded :class:`~ampsafe.core.graph.Graph`, written once for both frameworks.

A *path* starts at a conv/matmul output and follows its consumers through ops that leave range unchecked
(elementwise, layout, reduction, anything else). A branch ends at a normalization or bounded op
(normalized) or at the next conv/matmul, a loss or the model output (unnormalized). Every tensor on the
path, the outputs of the ops that end it included, counts for its float16 headroom: in the DBNet seed the
first value past 65504 is the output of the head conv that *ends* the unnormalized DBFPN concat path.
A mask's fill value (``finfo.min``, ``-inf``) on a path is not a value when it ends in a masked softmax, an
``exp`` or SDPA's ``attn_mask`` (:class:`_MaskLanes`), whatever the spelling (an additive float mask, ``where``,
``masked_fill`` with a number: the rule is stated once, at :data:`~ampsafe.core.graph.MASK_FILL_OPS`).
At O1 a value an op computes in float32 counts only if it is cast to float16 later (:class:`_CastsLow`): a
transformer's residual stream stays float32 under autocast, so a big sublayer output joining it does not flag
every earlier path that feeds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .graph import FP16_MAX, NORMALIZING_KINDS, START_KINDS, Graph, Node, OpKind, headroom_bits
from .scan_report import RiskOp, RiskPath

__all__ = ["analyze", "find_risky_ops", "merge_paths", "merge_risky_ops", "OUTPUT", "LOSS", "UNTRACED"]

OUTPUT = "<output>"
LOSS = "<loss>"
ROOT = "<root>"
UNTRACED = "<untraced>"


@dataclass
class _Walk:
    """What one walk from a start node collected (node indices kept so risky ops can skip covered nodes)."""

    ends: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    normalized: bool = True


def _add_unique(seq: list, item) -> None:
    if item not in seq:
        seq.append(item)


def _max(values) -> float | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if any(math.isnan(v) for v in vals):
        return math.inf
    return max(vals)


def _walk(graph: Graph, start: Node, consumers: dict[int, list[int]]) -> _Walk:
    walk = _Walk(layers=[start.module], ops=[start.label], nodes=[start.index])
    seen_tensors: set[int] = set()
    seen_nodes = {start.index}
    frontier = list(start.outputs)
    while frontier:
        tid = frontier.pop(0)
        if tid in seen_tensors:
            continue
        seen_tensors.add(tid)
        if tid in graph.outputs:
            _add_unique(walk.ends, OUTPUT)
            walk.normalized = False
        if graph.loss is not None and tid == graph.loss:
            _add_unique(walk.ends, LOSS)
            walk.normalized = False
        for idx in consumers.get(tid, ()):
            if idx in seen_nodes or idx <= start.index or graph.nodes[idx].kind is OpKind.FILL:
                continue
            seen_nodes.add(idx)
            node = graph.nodes[idx]
            walk.nodes.append(idx)
            _add_unique(walk.ops, node.label)
            _add_unique(walk.layers, node.module)
            if node.kind in START_KINDS or node.kind in NORMALIZING_KINDS:
                _add_unique(walk.ends, node.module or ROOT)
                if node.kind in START_KINDS:
                    walk.normalized = False
            elif node.kind is OpKind.LOSS:
                _add_unique(walk.ends, LOSS)
                walk.normalized = False
            else:
                frontier.extend(node.outputs)
    if not walk.ends:  # the values went into ops the tracer did not record: never claim they were normalized
        walk.ends.append(UNTRACED)
        walk.normalized = False
    return walk


# Ops that take a mask's fill value (finfo.min, -inf) and give back what the mask meant: exp(-inf) = 0, a masked
# softmax, a bounded op. SDPA takes its additive mask as an input, not as a value of its path.
_MASK_SINKS = frozenset({"softmax", "log_softmax", "exp", "sigmoid", "tanh"})
_MASK_CARRIERS = frozenset({OpKind.ELEMENTWISE, OpKind.OTHER})
_SDPA_DATA_INPUTS = 3  # query, key, value: a tensor after them in an SDPA node is its attn_mask


class _ConsumerWalk:
    """A memoized walk from a tensor through the nodes that consume it (``_follow``); a tensor met again on its
    own walk answers ``ON_CYCLE``. The two walks below share it: where mask lanes end, where float32 values go."""

    ON_CYCLE = False

    def __init__(self, graph: Graph, consumers: dict[int, list[int]]):
        self.graph = graph
        self.consumers = consumers
        self.memo: dict[int, bool] = {}

    def _tensor(self, tid: int, seen: set) -> bool:
        if tid in self.memo:
            return self.memo[tid]
        if tid in seen:
            return self.ON_CYCLE
        seen.add(tid)
        self.memo[tid] = answer = self._follow(tid, seen)
        return answer

    def _follow(self, tid: int, seen: set) -> bool:
        raise NotImplementedError


class _MaskLanes(_ConsumerWalk):
    """Whether a node's mask lanes (values at or below ``-MASK_LIMIT``) all end where a mask is meant to end.

    They may ride elementwise and layout ops (the scale, a cast, ``where``, ``masked_fill``, the add of a
    position bias) and must then reach a masked softmax, an ``exp``, a bounded op, SDPA's ``attn_mask``, or a
    non-floating result (a cast to an index). Reaching a matmul, a norm, a reduction, a loss or the model's
    output means they are values like any other, and count.
    """

    ON_CYCLE = True

    def absorbed(self, node: Node) -> bool:
        return all(self._tensor(t, set()) for t in node.outputs)

    def _follow(self, tid: int, seen: set) -> bool:
        g = self.graph
        ok = tid not in g.outputs and tid != g.loss
        for idx in self.consumers.get(tid, ()) if ok else ():
            c = g.nodes[idx]
            if c.kind is OpKind.FILL or c.op in _MASK_SINKS or c.kind is OpKind.BOUNDED:
                continue
            if c.op == "scaled_dot_product_attention":
                ok = tid not in c.inputs[:_SDPA_DATA_INPUTS]
            elif c.kind in _MASK_CARRIERS:
                ok = all(self._tensor(t, seen) for t in c.outputs)
            else:
                ok = False
            if not ok:
                break
        return ok


def _node_amax(node: Node, lanes: _MaskLanes | None) -> float | None:
    """The node's abs-max, its mask lanes left out when they end where a mask is meant to end."""
    if node.lane_amax is None or lanes is None or not lanes.absorbed(node):
        return node.amax
    return node.lane_amax


class _CastsLow(_ConsumerWalk):
    """Whether a float32 value on a path reaches float16: only then can it overflow there.

    At O1 a path's op may run in float32 (autocast promotes float16 and float32 inputs to float32: T5's residual
    stream adds float16 sublayer outputs to float32 embeddings) and its value stays float32 until a consumer casts
    it, which a low-precision op does (a conv/matmul, an elementwise op whose inputs are all float16). Views and
    ops bounded by their input (unmeasured) pass the value on unchanged; the model's output and loss count, since
    the caller may cast them.
    """

    def counts(self, node: Node) -> bool:
        if node.low_precision or node.kind in START_KINDS or self.graph.level != "O1":
            return True
        return any(self._tensor(t, set()) for t in node.outputs)

    def _follow(self, tid: int, seen: set) -> bool:
        g = self.graph
        hit = tid in g.outputs or tid == g.loss
        for idx in self.consumers.get(tid, ()) if not hit else ():
            c = g.nodes[idx]
            if c.kind is OpKind.FILL:
                continue
            if c.low_precision or c.kind in START_KINDS:
                hit = True
            elif c.amax is None:  # a view or an op bounded by its input: the same float32 values go on
                hit = any(self._tensor(t, seen) for t in c.outputs)
            if hit:
                break
        return hit


def _verdict(amax, grad_amax, margin_bits: float, loss_scale) -> tuple[float | None, bool, str | None]:
    room = headroom_bits(amax)
    overflows_in = None
    if amax is not None and not (amax <= FP16_MAX):
        overflows_in = "forward"
    elif loss_scale is not None and grad_amax is not None and not (grad_amax <= FP16_MAX):
        overflows_in = "backward"
    risky = (room is not None and room < margin_bits) or overflows_in is not None
    return room, risky, overflows_in


def _paths_with_nodes(graph: Graph, margin_bits: float, loss_scale) -> list[tuple[RiskPath, list[int]]]:
    consumers = graph.consumers()
    lanes = _MaskLanes(graph, consumers)
    casts = _CastsLow(graph, consumers)
    out = []
    for node in graph.nodes:
        if node.kind not in START_KINDS:
            continue
        walk = _walk(graph, node, consumers)
        nodes = [graph.nodes[i] for i in walk.nodes]
        amaxes = [_node_amax(n, lanes) if casts.counts(n) else None for n in nodes]
        amax = _max(amaxes)
        peak = next((n.label for n, a in zip(nodes, amaxes) if a is not None and _max([a]) == amax), "")
        grad = _max(n.grad_amax for n in nodes)
        room, risky, overflows_in = _verdict(amax, grad, margin_bits, loss_scale)
        path = RiskPath(
            start=node.module,
            layers=tuple(walk.layers),
            ends=tuple(walk.ends),
            ops=tuple(walk.ops),
            normalized=walk.normalized,
            amax=amax,
            headroom_bits=room,
            risky=risky,
            overflows_in=overflows_in,
            grad_amax=grad,
            start_op=node.op,
            peak=peak,
        )
        out.append((path, walk.nodes))
    return out


def find_risky_ops(graph: Graph, *, margin_bits: float = 4.0, covered: set[int] = frozenset()) -> list[RiskOp]:
    """Low-precision non-conv/matmul ops whose output leaves float16 range or is within ``margin_bits`` of it.

    ``covered``: node indices already reported through a risky path (not repeated here).
    """
    found: dict[tuple[str, str], RiskOp] = {}
    lanes = _MaskLanes(graph, graph.consumers())
    for node in graph.nodes:
        if not node.low_precision or node.kind in START_KINDS or node.index in covered or node.amax is None:
            continue
        amax = _node_amax(node, lanes)
        room = headroom_bits(amax)
        if room is None or room >= margin_bits:
            continue
        key = (node.module, node.op)
        prev = found.get(key)
        if prev is None or _max([prev.amax, amax]) != prev.amax:
            found[key] = RiskOp(module=node.module, op=node.op, amax=amax, headroom_bits=room)
    return list(found.values())


def analyze(graph: Graph, *, margin_bits: float = 4.0, loss_scale: float | None = None):
    """``(paths, risky_ops)`` of one graph; calls of a shared module are still separate paths here."""
    pairs = _paths_with_nodes(graph, margin_bits, loss_scale)
    covered = {i for p, nodes in pairs if p.risky for i in nodes}
    return [p for p, _ in pairs], find_risky_ops(graph, margin_bits=margin_bits, covered=covered)


def merge_paths(paths, *, margin_bits: float = 4.0, loss_scale: float | None = None) -> list[RiskPath]:
    """Merge paths with the same start (a shared module called twice, several calibration batches).

    Ends, ops and layers are united in first-seen order, amax is the max, and a merged path is normalized
    only if every call was.
    """
    merged: dict[tuple[str, str], RiskPath] = {}
    for p in paths:
        key = (p.start, p.start_op)
        m = merged.get(key)
        if m is None:
            merged[key] = RiskPath(**{**p.__dict__})
            continue
        m.layers = tuple(dict.fromkeys(m.layers + p.layers))
        m.ends = tuple(dict.fromkeys(m.ends + p.ends))
        m.ops = tuple(dict.fromkeys(m.ops + p.ops))
        m.normalized = m.normalized and p.normalized
        if p.amax is not None and _max([m.amax, p.amax]) != m.amax:
            m.peak = p.peak
        m.amax = _max([m.amax, p.amax])
        m.grad_amax = _max([m.grad_amax, p.grad_amax])
    for m in merged.values():
        m.headroom_bits, m.risky, m.overflows_in = _verdict(m.amax, m.grad_amax, margin_bits, loss_scale)
    return list(merged.values())


def merge_risky_ops(ops) -> list[RiskOp]:
    """One :class:`RiskOp` per (module, op), with the largest amax seen."""
    merged: dict[tuple[str, str], RiskOp] = {}
    for o in ops:
        key = (o.module, o.op)
        m = merged.get(key)
        if m is None or _max([m.amax, o.amax]) != m.amax:
            merged[key] = o
    return list(merged.values())
