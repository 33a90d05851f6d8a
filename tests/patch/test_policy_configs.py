"""Typed policies: a config object and its string shorthand patch identically, configs refuse bad fields,
are frozen and hashable, and a new policy is one new module that the registry discovers."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import numpy as np
import pytest

import ampsafe
from ampsafe import policies
from ampsafe.errors import ConfigError
from ampsafe.patching import patched_modules


@pytest.fixture(params=["torch", "paddle"])
def framework(request):
    pytest.importorskip(request.param)
    return request.param


def build(framework: str, kind: str, seed: int = 0):
    if framework == "torch":
        from patch_models import build_torch

        return build_torch(kind, seed=seed)
    from patch_models_paddle import build_paddle

    return build_paddle(kind, seed=seed)


def example(framework: str, request, kind: str = "overflow"):
    """The conftest input; the step head takes 4 channels, so it gets the first channel 4 times."""
    x = request.getfixturevalue(f"{framework}_input")
    if kind != "step":
        return x
    return x[:, :1].tile([1, 4, 1, 1]) if framework == "paddle" else x[:, :1].repeat(1, 4, 1, 1)


def fp16_output(framework: str, model, x) -> np.ndarray:
    """The model's output under the framework's float16 AMP (Paddle's emulated on a CPU)."""
    if framework == "torch":
        import torch

        with torch.autocast("cpu", dtype=torch.float16):
            return model(x).detach().float().numpy()
    from ampsafe.paddle import emulate_fp16

    with emulate_fp16(model):
        return model(x).astype("float32").numpy()


# --- a config and its shorthand -----------------------------------------------------------------------


def test_island_config_and_shorthand_patch_identically(framework, request):
    x = example(framework, request)
    typed, named = build(framework, "overflow", seed=3), build(framework, "overflow", seed=3)
    typed_report = ampsafe.patch(typed, (x,), policy=ampsafe.Island())
    named_report = ampsafe.patch(named, (x,), policy="island")
    assert typed_report.patched and typed_report.patched == named_report.patched
    assert typed_report.policy == named_report.policy == "island"
    assert patched_modules(typed) == patched_modules(named)
    assert list(typed.state_dict()) == list(named.state_dict())
    np.testing.assert_array_equal(fp16_output(framework, typed, x), fp16_output(framework, named, x))


@pytest.mark.parametrize(
    ("config", "shorthand", "options", "kind"),
    [
        (ampsafe.Auto(margin_bits=8.0), "auto", {"margin_bits": 8.0}, "overflow"),
        (ampsafe.ConvBN(act="relu", optimizers=[]), "convbn", {"act": "relu", "optimizers": []}, "overflow"),
        (ampsafe.Rescale(bits=3), "rescale", {"bits": 3}, "homogeneous"),
        (ampsafe.Rewrite(), "rewrite", {}, "step"),
    ],
    ids=["auto", "convbn", "rescale", "rewrite"],
)
def test_every_config_patches_like_its_shorthand_with_options(framework, request, config, shorthand, options, kind):
    x = example(framework, request, kind)
    typed, named = build(framework, kind, seed=5), build(framework, kind, seed=5)
    typed_report = ampsafe.patch(typed, (x,), policy=config)
    named_report = ampsafe.patch(named, (x,), policy=shorthand, **options)
    assert typed_report.patched and typed_report.patched == named_report.patched
    assert patched_modules(typed) == patched_modules(named)
    assert list(typed.state_dict()) == list(named.state_dict())


def test_shorthand_builds_the_config_it_names():
    assert policies.resolve("island", {}) == ampsafe.Island()
    assert policies.resolve("convbn", {"act": "relu"}) == ampsafe.ConvBN(act="relu")
    assert policies.resolve("rescale", {"bits": 2}) == ampsafe.Rescale(bits=2)
    assert policies.resolve("auto", {}, shared={"margin_bits": 2.0}) == ampsafe.Auto(margin_bits=2.0)
    assert policies.resolve("auto", {}, shared={"margin_bits": None}) == ampsafe.Auto()  # default 4.0 kept


def test_configs_are_exported_at_the_top_level():
    for name in ("Auto", "Island", "ConvBN", "Rescale", "Rewrite"):
        assert name in ampsafe.__all__ and issubclass(getattr(ampsafe, name), policies.PolicyConfig)


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fields", "allowed"),
    [
        (ampsafe.ConvBN, {"act": "tanh"}, "relu"),
        (ampsafe.ConvBN, {"act": 3}, "a module"),
        (ampsafe.ConvBN, {"optimizers": "adam"}, "list of optimizers"),
        (ampsafe.Rescale, {"bits": 0}, "whole number from 1"),
        (ampsafe.Rescale, {"bits": 2.5}, "whole number from 1"),
        (ampsafe.Rescale, {"bits": True}, "whole number from 1"),
        (ampsafe.Auto, {"margin_bits": -1.0}, "finite number >= 0"),
        (ampsafe.Auto, {"margin_bits": float("nan")}, "finite number >= 0"),
        (ampsafe.Auto, {"margin_bits": "4"}, "finite number >= 0"),
    ],
)
def test_a_bad_field_is_a_config_error_naming_it_and_what_is_allowed(config, fields, allowed):
    (field,) = fields
    with pytest.raises(ConfigError, match=f"{config.__name__}.{field} must be.*{allowed}"):
        config(**fields)


@pytest.mark.parametrize("shorthand", ["island", "rewrite"])
def test_a_config_without_fields_refuses_every_option(shorthand):
    with pytest.raises(ConfigError, match="takes no option bits.*its options: none"):
        policies.resolve(shorthand, {"bits": 3})
    with pytest.raises(TypeError):
        type(policies.resolve(shorthand, {}))(bits=3)


def test_the_shorthand_form_validates_like_the_config(torch_input):
    model = build("torch", "homogeneous")
    with pytest.raises(ConfigError, match="Rescale.bits"):
        ampsafe.patch(model, (torch_input,), policy="rescale", bits=0)
    with pytest.raises(ConfigError, match="ConvBN.act"):
        ampsafe.patch(model, policy="convbn", paths=["conv1"], optimizers=[], act="tanh")
    assert patched_modules(model) == {}


def test_a_config_takes_no_loose_options_and_no_contradicting_margin(torch_input):
    model = build("torch", "overflow")
    with pytest.raises(ConfigError, match="go in the config"):
        ampsafe.patch(model, (torch_input,), policy=ampsafe.Rescale(), bits=3)
    with pytest.raises(ConfigError, match="margin_bits=2.0 contradicts Auto"):
        ampsafe.patch(model, (torch_input,), policy=ampsafe.Auto(margin_bits=4.0), margin_bits=2.0)
    with pytest.raises(ConfigError, match=r"pass an instance, policy=Island\(\)"):
        ampsafe.patch(model, (torch_input,), policy=ampsafe.Island)
    with pytest.raises(ConfigError, match="policy must be a policy name"):
        ampsafe.patch(model, (torch_input,), policy=3)
    assert patched_modules(model) == {}


# --- frozen and hashable ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        ampsafe.Island(),
        ampsafe.Rewrite(),
        ampsafe.Auto(margin_bits=2.0),
        ampsafe.Rescale(bits=3),
        ampsafe.ConvBN(act="relu", optimizers=[object()]),
    ],
    ids=lambda c: type(c).__name__,
)
def test_a_config_is_frozen_and_hashable(config):
    same = dataclasses.replace(config)
    assert same == config and hash(same) == hash(config) and {config: 1}[same] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.extra = 1
    for f in dataclasses.fields(config):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, f.name, None)


def test_convbn_keeps_its_optimizers_as_a_tuple():
    opt = object()
    assert ampsafe.ConvBN(optimizers=[opt]).optimizers == (opt,)
    assert ampsafe.ConvBN(optimizers=opt).optimizers is opt  # one optimizer, as given


# --- a new policy is one new module -------------------------------------------------------------------

NEW_POLICY = '''
"""A policy that tags modules and changes nothing else: everything it needs is declared here."""

from dataclasses import dataclass

from ampsafe.errors import ConfigError
from ampsafe.policies import Change, Plan, PolicyConfig, action, path_starts, register
from ampsafe.core.swaps import SwapMixin, swap


class Tagged(SwapMixin):
    _ampsafe_protection = "tagged"
    _ampsafe_attrs = ("_ampsafe_note",)


@dataclass(frozen=True)
class Tag(PolicyConfig):
    name = "tag"
    note: str = "hello"

    def __post_init__(self):
        if not isinstance(self.note, str):
            raise ConfigError(f"Tag.note must be a string, got {self.note!r}")


@action("tag", protection="tagged")
def swap_tag(swaps, module, change):
    swap(module, Tagged, _ampsafe_note=change.params["note"])


@register(Tag)
def plan_tag(ctx):
    plan = Plan()
    for path in path_starts(ctx.paths or []):
        if ctx.allowed(path, plan, kind="tag"):
            plan.add(Change("tag", path, f"tagged {ctx.config.note}", {"note": ctx.config.note}))
    return plan
'''

NEW_MODULE = "tag_policy_for_test"


@pytest.fixture
def new_policy_module(tmp_path, monkeypatch):
    """``NEW_POLICY`` saved as a module of a folder added to ``ampsafe.policies``; the registry restored after."""
    (tmp_path / f"{NEW_MODULE}.py").write_text(textwrap.dedent(NEW_POLICY))
    monkeypatch.setattr(policies, "__path__", [*policies.__path__, str(tmp_path)])
    from ampsafe.policies import _registry

    policies.names()  # register the built-in policies first, so the restored tables hold them
    for table in ("_CONFIGS", "_HANDLERS", "_ACTIONS"):
        monkeypatch.setattr(_registry, table, dict(getattr(_registry, table)))
    qualified = f"ampsafe.policies.{NEW_MODULE}"
    yield qualified
    sys.modules.pop(qualified, None)
    if hasattr(policies, NEW_MODULE):
        delattr(policies, NEW_MODULE)


def test_a_new_policy_is_one_new_module(framework, request, new_policy_module):
    x = example(framework, request)
    model = build(framework, "overflow")
    keys = list(model.state_dict())
    before = fp16_output(framework, model, x)
    assert "tag" in policies.names()  # discovered, no list edited
    report = ampsafe.patch(model, policy="tag", paths=["conv1"], note="by name")
    assert report.patched == ["conv1"] and report.details["conv1"] == "tagged by name"
    assert patched_modules(model) == {"conv1": "tagged"} and model.conv1._ampsafe_note == "by name"
    tag = sys.modules[new_policy_module].Tag
    again = ampsafe.patch(model, policy=tag(), paths=["conv1", "conv2"])
    assert again.patched == ["conv2"]  # conv1 already tagged: a no-op there
    with pytest.raises(ConfigError, match="Tag.note"):
        ampsafe.patch(model, policy="tag", paths=["fc"], note=1)
    assert list(model.state_dict()) == keys
    np.testing.assert_array_equal(fp16_output(framework, model, x), before)
    ampsafe.unpatch(model)
    assert patched_modules(model) == {} and not hasattr(model.conv1, "_ampsafe_note")
