"""``backend.swaps``: the module facts the patch policies read, one part of each framework's Backend, and the one
rule of module paths (``ampsafe.core.modpath``) that patch, scan, heal and ``ampsafe run`` share."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ampsafe
from ampsafe.core import modpath
from ampsafe.errors import ConfigError
from ampsafe.patching import island_layers, patched_modules
from ampsafe.policies.convbn import ACTIVATIONS

PACKAGE = Path(ampsafe.__file__).parent


def _protocol_members(protocol) -> set[str]:
    members = set(getattr(protocol, "__annotations__", {}))
    return members | {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}


def _torch():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Step(nn.Module):
        """A logistic through ``exp``: what ``policy="rewrite"`` rewrites."""

        def forward(self, x):
            return torch.reciprocal(1 + torch.exp(-x))

    class Twice(nn.Module):
        """One ``Step`` held under two paths: ``step`` and ``head.1``."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.step = Step()
            self.head = nn.Sequential(nn.Conv2d(4, 4, 1), self.step)

        def forward(self, x):
            return self.head(self.step(self.conv(x)))

    return "torch", Twice, lambda: nn.Conv2d(3, 4, 3, bias=False), lambda: torch.randn(1, 3, 6, 6)


def _paddle():
    paddle = pytest.importorskip("paddle")
    nn = paddle.nn

    class Step(nn.Layer):
        def forward(self, x):
            return paddle.reciprocal(1 + paddle.exp(-x))

    class Twice(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2D(3, 4, 3)
            self.step = Step()
            self.head = nn.Sequential(nn.Conv2D(4, 4, 1), self.step)

        def forward(self, x):
            return self.head(self.step(self.conv(x)))

    return "paddle", Twice, lambda: nn.Conv2D(3, 4, 3, bias_attr=False), lambda: paddle.randn([1, 3, 6, 6])


FRAMEWORKS = [pytest.param(_torch, id="torch"), pytest.param(_paddle, id="paddle")]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_backends_swaps_implement_every_member_the_protocol_lists(framework):
    from ampsafe._framework import backend_named
    from ampsafe.core.backend import Backend
    from ampsafe.core.swaps import SwapMixin, Swaps

    name, _, conv, _ = framework()
    backend = backend_named(name)
    swaps = backend.swaps
    members = _protocol_members(Swaps)
    assert {"convs", "norms", "island", "rescaled_norm", "is_conv", "new_batch_norm", "is_distributed"} <= members
    assert not sorted(n for n in members if not hasattr(swaps, n))
    assert "swaps" in _protocol_members(Backend)
    # each fact once: what the Backend knows (paths, parameters, snapshots) is not restated by its swaps part
    assert not members & _protocol_members(Backend)
    assert swaps.backend is backend
    assert issubclass(swaps.island, SwapMixin) and issubclass(swaps.rescaled_norm, SwapMixin)
    made = conv()
    assert swaps.is_conv(made) and not swaps.has_bias(made)
    bn = swaps.new_batch_norm(made)
    assert swaps.is_norm(bn) and not swaps.is_conv(bn)
    assert sorted(swaps.activations) == sorted(ACTIVATIONS)  # what ConvBN(act=) accepts, every framework builds
    assert isinstance(swaps.activation("relu"), backend.module_type)
    with pytest.raises(ConfigError, match="act must be one of"):
        swaps.activation("swish9")


def test_adapters_and_core_import_nothing_from_the_policies():
    """The policies stand on the adapters' swaps part, never the other way round (``core.swaps`` is below both)."""
    wrong = []
    for folder in ("core", "torch", "paddle"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    target = "." * node.level + (node.module or "")
                    if "policies" in target.split("."):
                        wrong.append(f"{path.relative_to(PACKAGE)}: from {target} import ...")
    assert not wrong


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_module_held_under_two_paths_is_patched_once_and_named_by_its_first_path(framework):
    _, build, _, _ = framework()
    model = build()
    report = ampsafe.patch(model, policy="rewrite")  # every module is looked at: the shared one once
    assert report.patched == ["step"] and patched_modules(model) == {"step": "rewrite"}
    ampsafe.unpatch(model)
    ampsafe.patch(model, policy="island", paths=["step"])
    assert patched_modules(model) == {"step": "island"} and island_layers(model) == [model.step]
    with pytest.raises(ConfigError, match="'head.1' is a second path to the module 'step'"):
        ampsafe.patch(model, policy="convbn", paths=["head.1"])
    with pytest.raises(ConfigError, match="the model has no module 'head.7'"):
        ampsafe.patch(model, policy="island", paths=["head.7"])


def test_module_paths_nest_by_their_dots_not_by_string_prefixes():
    assert modpath.under("neck.in5.conv", "neck.in5") and modpath.under("neck", "neck")
    assert modpath.under("anything", "") and not modpath.under("", "neck")
    assert not modpath.under("neck.in5", "neck.in") and not modpath.under("neck", "neck.in5")
    assert modpath.ancestors("a.b.c") == ["a.b.c", "a.b", "a", ""] and modpath.ancestors("") == [""]
    assert modpath.parent("neck.conv.weight") == "neck.conv" and modpath.parent("fc") == ""
    assert modpath.parts("") == [] and modpath.parts("head.1") == ["head", "1"]
    assert [modpath.join("model", p) for p in ("", "fc")] == ["model", "model.fc"]
    assert modpath.join("", "fc") == "fc"
    listed = ["neck.in5", "neck", "head.conv", "neck.in5.conv", "head.conv", "neck.in"]
    assert modpath.outermost(listed) == ["neck", "head.conv"]
    assert modpath.innermost(listed) == ["head.conv", "neck.in5.conv", "neck.in"]
