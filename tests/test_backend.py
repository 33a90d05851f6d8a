"""The per-framework Backend: the facts scan, patch, watch and heal share, on real torch and Paddle models."""

from __future__ import annotations

import numpy as np
import pytest

from ampsafe._framework import backend_of


def _torch():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))

    return torch, build, lambda params: torch.optim.SGD(params, lr=0.1), lambda: torch.randn(2, 3, 8, 8)


def _paddle():
    paddle = pytest.importorskip("paddle")
    nn = paddle.nn

    def build():
        paddle.seed(0)
        return nn.Sequential(nn.Conv2D(3, 4, 3), nn.BatchNorm2D(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))

    return (
        paddle,
        build,
        lambda params: paddle.optimizer.SGD(learning_rate=0.1, parameters=params),
        lambda: paddle.randn([2, 3, 8, 8]),
    )


FRAMEWORKS = [pytest.param(_torch, id="torch"), pytest.param(_paddle, id="paddle")]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_owner_of_an_optimizer_is_the_smallest_module_covering_its_parameters(framework):
    fw, build, sgd, _ = framework()
    model = build()
    backend = backend_of(model)
    head = model[3]
    wrapper = type(model)(model)  # a wrapper with the very same parameters (as DDP would be) gives way
    assert backend.owner_of(sgd(list(model.parameters())), [wrapper]) is model
    assert backend.owner_of(sgd(list(head.parameters())), [model]) is head
    assert backend.owner_of(sgd([*model[0].parameters(), *head.parameters()]), [model]) is model
    other = build()
    assert backend.owner_of(sgd(list(other.parameters())), [model]) is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_owner_of_without_candidates_searches_the_live_modules(framework):
    fw, build, sgd, _ = framework()
    model, _bystander = build(), build()
    backend = backend_of(model)
    assert backend.owner_of(sgd(list(model.parameters()))) is model
    assert backend.owner_of(sgd(list(model[3].parameters()))) is model[3]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_snapshot_restores_the_normalization_statistics_a_train_forward_moved(framework):
    fw, build, _, batch = framework()
    model = build()
    backend = backend_of(model)
    mean = backend.running_stats(model).__next__()[2]
    before = backend.to_numpy(mean).copy()
    assert any(t is mean for t in backend.state_tensors(model))  # Paddle's _mean is a parameter: one rule
    restore = backend.snapshot(model)
    model.train()
    model(batch())
    assert not np.array_equal(backend.to_numpy(mean), before)
    restore()
    np.testing.assert_array_equal(backend.to_numpy(mean), before)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_backend_is_one_instance_per_framework_and_gathers_alone_outside_a_process_group(framework):
    fw, build, _, batch = framework()
    model = build()
    backend = backend_of(model)
    assert backend is backend_of(build()) and backend.name == fw.__name__
    assert backend.all_gather({"rank": "only"}) == [{"rank": "only"}]
    assert set(backend.modules(model)) == {"", "0", "1", "2", "3"}
    out = (batch(), {"a": [batch(), 3]})
    assert len(backend.tensors(out)) == 2
    assert backend.trace_hooks(model, level="O1", target="cpu").framework == backend.name
    signed = (fw.to_tensor if hasattr(fw, "to_tensor") else fw.tensor)([-3.0, 2.0])
    assert float(backend.abs_max(signed)) == 3.0


def test_torch_float32_region_turns_autocast_off():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 4)
    backend = backend_of(model)
    with torch.autocast("cpu", dtype=torch.float16):
        assert model(torch.randn(2, 4)).dtype == torch.float16
        with backend.float32():
            assert model(torch.randn(2, 4)).dtype == torch.float32


def _protocol_members() -> set[str]:
    """Every member the Backend protocol in ``ampsafe/core/backend.py`` declares (methods, properties, facts)."""
    from ampsafe.core.backend import Backend

    declared = set(getattr(Backend, "__annotations__", {}))
    declared |= {
        n for n, v in vars(Backend).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    return declared


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_backend_implements_every_member_the_protocol_lists(framework):
    module, build, _, _ = framework()
    from ampsafe._framework import REGISTRY, backend_named

    backend = backend_named(module.__name__)
    members = _protocol_members()
    assert {"modules", "snapshot", "float32", "trace", "watch", "patcher", "forward_pre_hook"} <= members
    missing = sorted(n for n in members if not hasattr(backend, n))
    assert not missing, f"{type(backend).__name__} lacks {missing}"
    assert backend.name == module.__name__ and module.__name__ in REGISTRY
    assert isinstance(build(), backend.module_type)
