"""Shared fixtures for the sentinel tests: a hook census to prove nothing is left on a model."""

from __future__ import annotations

import pytest


def _torch_hook_census(model) -> dict:
    """Every hook a torch model (and torch globally) carries: module hooks, parameter hooks, global hooks, modes."""
    import torch
    from torch.nn.modules import module as M
    from torch.overrides import _get_current_function_mode_stack

    counts = {"module": 0, "param": 0}
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            counts["module"] += len(getattr(m, attr))
    for p in model.parameters():
        counts["param"] += len(p._backward_hooks or {})
    counts["global"] = len(M._global_forward_hooks) + len(M._global_forward_pre_hooks) + len(M._global_backward_hooks)
    counts["modes"] = len(_get_current_function_mode_stack())
    counts["tensor_backward"] = torch.Tensor.backward.__qualname__
    return counts


def _paddle_hook_census(model) -> dict:
    import paddle

    from ampsafe.paddle import intercept

    counts = {"layer": 0}
    for layer in [model, *model.sublayers()]:
        counts["layer"] += len(layer._forward_pre_hooks) + len(layer._forward_post_hooks)
    counts["modes"] = len(intercept.active_modes())
    counts["backward"] = getattr(paddle.Tensor.backward, "_ampsafe_watch", False)
    counts["wrapped_forward"] = "forward" in vars(model)
    return counts


@pytest.fixture
def torch_hook_census():
    """census(model) -> every hook a torch model (and torch globally) carries."""
    return _torch_hook_census


@pytest.fixture
def paddle_hook_census():
    """census(model) -> every hook / wrapper a paddle model carries, and the active op modes."""
    return _paddle_hook_census


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """On the shared 2-core machine two OpenMP threads thrash (a 70-step toy run: 23 s vs 0.4 s); restored after."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def frcnn_model():
    """The seed report's model family: torchvision Faster R-CNN (mobilenet v3 320 FPN), random weights, train mode."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5
    )
    return model.train()
