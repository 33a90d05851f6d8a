"""Path analysis on hand-built graphs: the framework-neutral rules, without running a model."""

from __future__ import annotations

import math

from ampsafe.core.graph import Graph, OpKind
from ampsafe.core.paths import analyze, merge_paths


def _graph():
    g = Graph()
    g.add("conv2d", OpKind.CONV, "a", [0, 1], [2], amax=10.0, low_precision=True)
    g.add("interpolate", OpKind.ELEMENTWISE, "", [2], [3], amax=10.0)
    g.add("add", OpKind.ELEMENTWISE, "", [3, 9], [4], amax=5000.0, low_precision=True)
    g.add("conv2d", OpKind.CONV, "b", [4, 5], [6], amax=70000.0, low_precision=True)
    g.add("batch_norm", OpKind.NORM, "bn", [6], [7], amax=3.0, low_precision=True)
    g.add("conv2d", OpKind.CONV, "c", [2, 8], [10], amax=1.0, low_precision=True)
    g.add("exp", OpKind.ELEMENTWISE, "", [7], [11], amax=1e6, low_precision=True)
    g.add("conv2d", OpKind.CONV, "d", [11], [12], amax=1.0)  # its output goes nowhere the trace saw
    return g


def test_path_branches_and_counts_the_ending_ops_output():
    paths, ops = analyze(_graph(), margin_bits=4.0)
    a = paths[0]
    assert a.start == "a" and set(a.ends) == {"b", "c"} and not a.normalized
    assert a.ops[0] == "a:conv2d" and set(a.ops) == {"a:conv2d", ":interpolate", ":add", "b:conv2d", "c:conv2d"}
    assert a.amax == 70000.0 and a.risky and a.overflows_in == "forward"
    assert math.isclose(a.headroom_bits, math.log2(65504 / 70000))
    b = paths[1]
    assert b.ends == ("bn",) and b.normalized and b.risky  # normalized, but its own output overflows
    assert [(o.module, o.op) for o in ops] == [("", "exp")]  # the add is covered by path a


def test_path_into_untraced_ops_is_not_called_normalized():
    paths, _ = analyze(_graph())
    d = [p for p in paths if p.start == "d"][0]
    assert d.ends == ("<untraced>",) and not d.normalized


def test_merged_calls_take_the_max_and_all_ends():
    first, _ = analyze(_graph())
    g = _graph()
    g.nodes[5].module = "e"  # in the second call "a" feeds another conv, with more headroom everywhere
    g.nodes[3].amax = 100.0
    second, _ = analyze(g)
    merged = {p.start: p for p in merge_paths(first + second)}
    a = merged["a"]
    assert set(a.ends) == {"b", "c", "e"} and a.amax == 70000.0 and a.risky
    assert len([p for p in merge_paths(first + second) if p.start == "a"]) == 1
