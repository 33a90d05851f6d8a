"""Shared, session-scoped workloads for tests/workloads (read-only use: tests that train build their own)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """For the tiny torch models: one thread is fastest, and on a shared 2-core machine two spin against each other.
    A module uses it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def det_frcnn():
    from ampsafe_lab.workloads import build

    return build("frcnn", seed=0, image_size=256, batch_size=2)


@pytest.fixture(scope="session")
def det_ppyolo_tiny():
    from ampsafe_lab.workloads import build

    return build("ppyolo", seed=0, config="tiny")


@pytest.fixture(scope="session")
def det_ppyolo_r50():
    from ampsafe_lab.workloads import build

    return build("ppyolo", seed=0, config="r50vd_dcn")


def det_loss_trajectory(workload, *, steps: int = 20, lr: float) -> list[float]:
    """FP32 losses of ``steps`` optimizer steps, each on a distinct batch (step i trains on batch(i))."""
    optimizer = workload.make_optimizer(lr)
    losses = []
    for step in range(steps):
        loss = workload.loss(workload.batch(step))
        if workload.framework == "torch":
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        losses.append(float(loss.detach()))
    return losses


def det_loss_falls(losses: list[float], *, by: float = 0.2) -> bool:
    """The issue's definition: mean of the last 5 losses at least ``by`` below the mean of the first 5."""
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    return last <= (1.0 - by) * first


@pytest.fixture(scope="session")
def det_train():
    """``det_train(workload, lr=...) -> losses``: see :func:`det_loss_trajectory`."""
    return det_loss_trajectory


@pytest.fixture(scope="session")
def det_falls():
    """``det_falls(losses) -> bool``: see :func:`det_loss_falls`."""
    return det_loss_falls
