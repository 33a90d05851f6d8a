"""The interface every reference workload implements (see ``ampsafe_lab.workloads.build``)."""

from __future__ import annotations

import contextlib

from ampsafe._framework import require


class Workload:
    """A model in train mode with deterministic synthetic data and its own loss.

    ``framework`` is "torch" or "paddle"; ``model(*example_inputs)`` runs a forward. ``batch(step)`` returns
    the same batch for the same step and seed; ``loss(batch)`` a scalar loss tensor (forward included).
    ``evaluate()`` returns the workload's accuracy metric on held-out synthetic data (e.g. ``{"hmean": ...}``).
    """

    name: str = ""
    framework: str = ""

    def __init__(self, model, example_inputs: tuple, *, seed: int = 0):
        self.model = model
        self.example_inputs = example_inputs
        self.seed = seed

    def batch(self, step: int):
        raise NotImplementedError

    def loss(self, batch):
        raise NotImplementedError

    def make_optimizer(self, lr: float):
        """The optimizer the workload's recipe uses (Adam for dbnet, SGD-momentum for the detectors)."""
        raise NotImplementedError

    def evaluate(self, **options) -> dict:
        raise NotImplementedError

    @contextlib.contextmanager
    def evaluating(self):
        """The body runs in eval mode without gradients; the model's train or eval mode is restored after it."""
        no_grad = require(self.framework).no_grad
        was_training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                yield
        finally:
            self.model.train(was_training)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.framework})>"
