"""The guard of ``ampsafe.watch(guard=True)``: one fused finiteness check per step, a full-hooks replay on a hit.

Why apart: the guard is the cheap mode (no op hooks at all until something goes wrong) and its logic (snapshot,
replay, restore) is independent of the origin search it falls back on. Pure Python.
"""

from __future__ import annotations

from .sentinel import UNKNOWN, nonfinite_error

__all__ = ["Guard"]

_NOT_REPRODUCED = (
    "the replay ran the step again with full hooks and no op went non-finite, so the origin is not known "
    "(state the replay does not restore, or a non-deterministic op, made the difference)"
)


class Guard:
    """Mixin of :class:`~ampsafe.core.watcher.WatchBase`: ``check`` / ``step`` and the replay."""

    def step(self, loss=None, *, replay=None, grads: bool = True) -> bool:
        """Alias of ``check``: the per-step hook of a training loop."""
        return self.check(loss, replay=replay, grads=grads)

    def check(self, loss=None, *, replay=None, grads: bool = True) -> bool:
        """True when the loss and every gradient are finite (one fused host sync); else localize and report.

        Call it after ``backward()`` (after ``scaler.unscale_`` with a GradScaler, or with ``grads=False``).
        ``replay()``: recomputes the same loss (forward + loss, no backward); on a hit the step's RNG and
        buffers are restored, it runs with full hooks (and its backward too, when the loss was finite), the
        gradients are put back and the buffers reset to before the bad step. Returns False when the step
        must be skipped (``on_nonfinite="record"``); raises with ``"raise"``.
        """
        snap, self._snapshot = self._snapshot, None
        self.step_count += 1
        params = self.backend.parameters(self.model) if grads else []
        if self.tensors.grads_finite(params, loss):
            return True
        loss_bad = loss is not None and not all(self.tensors.finite(v) for v in self._float_tensors(loss))
        before = len(self.events)
        if replay is not None and snap is not None:
            self._replay(replay, snap, run_backward=not loss_bad)
        if len(self.events) == before:
            what = "the loss" if loss_bad else self._grad_what
            err = nonfinite_error(
                phase="forward" if loss_bad else "backward",
                module="<loss>" if loss_bad else "",
                op="loss" if loss_bad else "grad_norm",
                kind=UNKNOWN,
                where=f"guard: {what} is non-finite"
                + ("; the replay did not reproduce it" if replay is not None else ""),
                step=self.step_count - 1,
                reason=_NOT_REPRODUCED if replay is not None and snap is not None else "",
            )
            self.report(err)
        return False

    def _replay(self, replay, snap, *, run_backward: bool) -> None:
        """Re-run the bad step from its snapshot (a :class:`~ampsafe.core.watcher.Snapshot`) with full hooks; the
        gradients and buffers end as they were, the RNG as the replay left it (as the step did)."""
        restore_grads = self._stash_grads()
        snap.restore()
        self._replaying = True
        self._install_full()
        try:
            loss = replay()
            if run_backward and self.backward and self._runs_backward(loss):
                if not (self._pass and self._pass.done):
                    loss.backward()
        finally:
            self._remove_full()
            self._replaying = False
            restore_grads()
            snap.state()

    def _runs_backward(self, loss) -> bool:
        """Whether the replayed loss is a tensor with a gradient to propagate."""
        return isinstance(loss, self.tensors.tensor_type) and self.tensors.requires_grad(loss)
