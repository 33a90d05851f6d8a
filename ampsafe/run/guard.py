"""``ampsafe run``'s FP32 guard: every optimizer step that no ampsafe scaler guards is checked first.

An FP32 script (no GradScaler, or one disabled on a CPU) that meets one NaN batch ends with NaN parameters:
the optimizer writes the NaN gradient into every weight. Here each optimizer's ``step`` (torch) or
``step`` / ``minimize`` (Paddle) is wrapped, class by class, at its first construction; before the real step
the loss of the latest ``backward()`` and every gradient are checked by fused kernels with one host sync
(torch: ``_foreach_norm`` per device and dtype, read-only; Paddle: its ``check_finite_and_unscale`` kernel, as
its scaler), and a non-finite step is skipped: parameters and optimizer state untouched, the step counted. Steps done inside an enabled ampsafe scaler's ``step`` / ``minimize`` are the scaler's:
they pass through (:func:`through_scaler`), so no step is skipped or counted twice.

* ``max_skips``: more than that many skipped steps in a row stop the run (:class:`SkippedStepsError`), since
  a diverged run would skip every later step;
* ``watch``: the first non-finite step stops the run with :class:`ampsafe.NonFiniteError`: the inputs of the
  model's latest forward (:class:`~ampsafe.core.capture.InputCapture`) are replayed under ``ampsafe.watch``,
  model state restored, which names the op, module, pass, sample and kind.

The model is the smallest module covering the optimizer's parameters (``Backend.owner_of``), as the scalers
find it. Steps are numbered from 0, as ``scaler.stats.total_steps`` counts them. Framework-neutral: the
framework's pieces are the two small adapters :func:`install_torch` and :func:`install_paddle`, called by
``ampsafe.auto`` after that framework is imported.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable

from ..errors import AmpSafeError

__all__ = ["StepGuard", "SkippedStepsError", "through_scaler", "install_torch", "install_paddle", "guards"]

_tls = threading.local()  # .scaler: depth inside an enabled ampsafe scaler's step; .step: inside a guarded step
_guards: list[StepGuard] = []


class SkippedStepsError(AmpSafeError, FloatingPointError):
    """More than ``max_skips`` optimizer steps in a row had a non-finite loss or gradient.

    ``steps``: the skipped step numbers; ``offenders``: parameter names with non-finite gradients (last step).
    """

    def __init__(self, message: str, *, steps=(), offenders=()):
        super().__init__(message)
        self.steps = list(steps)
        self.offenders = list(offenders)


def guards() -> list[StepGuard]:
    return list(_guards)


def _depth(name: str) -> int:
    return getattr(_tls, name, 0)


@contextlib.contextmanager
def _inside(name: str):
    setattr(_tls, name, _depth(name) + 1)
    try:
        yield
    finally:
        setattr(_tls, name, _depth(name) - 1)


def scaler_guards(scaler) -> bool:
    """Whether ``scaler`` checks its optimizer's gradients itself (enabled, or in its own FP32 guard mode)."""
    if getattr(scaler, "_guard", False):
        return True
    for name in ("is_enabled", "is_enable"):  # torch / Paddle spelling
        method = getattr(scaler, name, None)
        if method is not None:
            return bool(method())
    return False


def through_scaler(scaler):
    """Context for a scaler's ``step`` / ``minimize``: the optimizer steps inside it are the scaler's to guard
    (a disabled scaler guards nothing: its steps stay ours)."""
    return _inside("scaler") if scaler_guards(scaler) else contextlib.nullcontext()


class StepGuard:
    """The guard of one framework's optimizers.

    ``backend``: the framework's :class:`~ampsafe.core.backend.Backend`; ``finite(optimizer, loss) -> bool``:
    the loss and every gradient finite, one host sync; ``offenders(optimizer) -> [(param, label)]``: the
    parameters with non-finite gradients (rare path).
    """

    def __init__(
        self,
        backend,
        finite: Callable,
        offenders: Callable,
        *,
        max_skips: int = 10,
        watch: bool = False,
        say: Callable[[str], None] = lambda _m: None,
    ):
        self.backend, self._finite, self._offenders = backend, finite, offenders
        self.max_skips, self.watch, self._say = max_skips, watch, say
        self.enabled = True
        self.total_steps = 0
        self.skipped_steps = 0
        self.in_a_row = 0
        self.skipped_at: list[int] = []
        self.offender_names: list[str] = []
        self.scaler_steps = 0  # optimizer steps an ampsafe scaler guarded (passed through)
        self._models: dict[int, Any] = {}  # id(optimizer) -> model
        self._captures: dict[int, Any] = {}  # id(model) -> InputCapture (watch only)
        self._loss = None
        _guards.append(self)

    # -- what the adapters call
    def note_loss(self, loss) -> None:
        """The tensor a ``backward()`` started from (the step's loss, checked with the gradients)."""
        self._loss = loss

    def new_optimizer(self, optimizer) -> None:
        """With ``watch``: find the model now and keep its forward inputs, so that even step 0 can be replayed."""
        if self.watch and self.enabled:
            self._model_of(optimizer)

    def step(self, optimizer, run: Callable[[], Any], loss=None, *, closure: bool = False, skipped: Any = None):
        """``run()`` (the real step) unless the loss or a gradient is non-finite; ``skipped`` (or ``skipped()``) when
        skipped (what the caller may unpack: Paddle's ``minimize`` returns ``(optimize_ops, params_grads)``)."""
        if not self.enabled or _depth("step"):
            return run()
        if _depth("scaler"):
            self.scaler_steps += 1
            self._drop(self._models.get(id(optimizer)))
            return run()
        if closure:  # the closure computes the gradients inside the step: nothing to check before it
            return run()
        with _inside("step"):
            loss = loss if loss is not None else self._loss
            self._loss = None
            model = self._model_of(optimizer)
            try:
                finite = self._finite(optimizer, loss)
                index = self.total_steps
                self.total_steps += 1
                if finite:
                    self.in_a_row = 0
                    return run()
                self._skip(optimizer, index, model)
                return skipped() if callable(skipped) else skipped
            finally:
                self._drop(model)

    def models(self) -> list:
        """The models found for the optimizers seen so far (owner of each optimizer's parameters)."""
        return [m for m in self._models.values() if m is not None]

    # -- internals
    def _drop(self, model) -> None:
        capture = self._captures.get(id(model)) if model is not None else None
        if capture is not None:
            capture.drop()

    def _model_of(self, optimizer):
        key = id(optimizer)
        if key not in self._models:
            try:
                model = self.backend.owner_of(optimizer)
            except Exception:  # finding the model is for naming and replay only: the guard works without it
                model = None
            self._models[key] = model
            if model is not None:
                self._say(f"guarding the optimizer steps of {type(model).__name__} (FP32 guard)")
                if self.watch and id(model) not in self._captures:
                    from ..core.capture import InputCapture

                    self._captures[id(model)] = InputCapture(self.backend, model)
        return self._models[key]

    def _names(self, optimizer, model) -> list[str]:
        found = self._offenders(optimizer)
        names = {id(p): n for n, p in (model.named_parameters() if model is not None else [])}
        return [names.get(id(p), label) for p, label in found]

    def _skip(self, optimizer, index: int, model) -> None:
        self.skipped_steps += 1
        self.in_a_row += 1
        self.skipped_at.append(index)
        try:
            self.offender_names = self._names(optimizer, model)
        except Exception:
            self.offender_names = []
        where = f"; non-finite gradients: {', '.join(self.offender_names[:5])}" if self.offender_names else ""
        more = f" (+{len(self.offender_names) - 5} more)" if len(self.offender_names) > 5 else ""
        self._say(f"step {index}: non-finite loss or gradients, step skipped (parameters untouched){where}{more}")
        if self.watch:
            self._replay(index, model)
        if self.in_a_row > self.max_skips:
            raise SkippedStepsError(
                f"{self.in_a_row} optimizer steps in a row (steps {self.skipped_at[-self.in_a_row]}-{index}) had a "
                f"non-finite loss or gradients and were skipped{where}{more}: the run has diverged or its data "
                "keeps producing NaN. Run again with `ampsafe run --watch` to stop at the first such step with its "
                "origin (op, module, sample), or `--max-skips K` to ride out a longer bad stretch",
                steps=self.skipped_at[-self.in_a_row :],
                offenders=self.offender_names,
            )

    def _replay(self, index: int, model) -> None:
        """``watch``: replay the latest forward under ``ampsafe.watch`` (state restored) and raise what it names."""
        from ..core.sentinel import UNKNOWN, nonfinite_error

        capture = self._captures.get(id(model)) if model is not None else None
        latest = capture.latest if capture is not None else None
        if latest is not None:
            import ampsafe

            args, kwargs = latest
            restore = self.backend.snapshot(model)
            watcher = ampsafe.watch(model)
            # its forward count numbers the pass as the step (the count starts at the pass entered)
            if hasattr(watcher, "_forward_count"):
                watcher._forward_count = index
            try:
                with watcher:
                    model(*args, **kwargs)
            except ampsafe.NonFiniteError as exc:
                exc.add_note(
                    f"ampsafe run --watch: optimizer step {index} was skipped; the replay of its forward "
                    "found this origin"
                )
                raise
            finally:
                restore()
            why = (
                "the replay of its forward under ampsafe.watch was finite: the non-finite value comes from the "
                "loss computed outside the model, or from the backward pass"
            )
        else:
            why = "the model's inputs for this step were not captured, so its forward could not be replayed"
        names = ", ".join(self.offender_names[:5])
        raise nonfinite_error(
            phase="backward",
            module="<loss>",
            op="loss",
            kind=UNKNOWN,
            where=f"optimizer step skipped by ampsafe run's FP32 guard; non-finite gradients: {names or 'none'}",
            step=index,
            reason=why,
        )

    def to_dict(self) -> dict:
        models = {type(m).__name__ for m in self._models.values() if m is not None}
        return {
            "framework": self.backend.name,
            "model": ", ".join(sorted(models)) or None,
            "total_steps": self.total_steps,
            "skipped_steps": self.skipped_steps,
            "skipped_at": list(self.skipped_at[-100:]),
            "offenders": list(self.offender_names),
            "scaler_steps": self.scaler_steps,
            "max_skips": self.max_skips,
        }


def _wrap_step(cls, name: str, guard: StepGuard, loss_of: Callable, closure_of: Callable, skipped: Any = None) -> None:
    """Replace ``cls.<name>`` by the guarded step (once: inherited and already-wrapped ones are left alone);
    a skipped step returns ``skipped``."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, "__ampsafe_guard__", False):
        return

    @functools.wraps(original)
    def guarded(self, *args, **kwargs):
        return guard.step(
            self,
            lambda: original(self, *args, **kwargs),
            loss_of(args, kwargs),
            closure=closure_of(args, kwargs),
            skipped=skipped,
        )

    guarded.__ampsafe_guard__ = True
    setattr(cls, name, guarded)


def install_torch(torch, guard: StepGuard, set_attr: Callable) -> str:
    """Guard every ``torch.optim.Optimizer`` subclass's ``step`` (wrapped at its first construction; torch's own
    step wrapper, the profiler and the step hooks, sits inside), and note each ``Tensor.backward``'s loss."""
    from ..torch.grads import nonfinite_params

    def finite(optimizer, loss) -> bool:
        # read-only: the L2 norm of every gradient, one fused call per (device, dtype), accumulated in float32;
        # NaN/inf propagate into it (so does a norm past float32's range, ~1.8e19: a diverged step either way)
        groups: dict = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                grad = p.grad
                if grad is not None:
                    grad = grad._values() if grad.is_sparse else grad
                    groups.setdefault((grad.device, grad.dtype), []).append(grad)
        if not groups and loss is None:
            return True
        flags = []
        with torch.no_grad():
            for (_device, dtype), grads in groups.items():
                norms = torch._foreach_norm(
                    grads, 2.0, dtype=None if dtype in (torch.float32, torch.float64) else torch.float32
                )
                flags.append(torch.stack(norms).isfinite().all())
            if loss is not None and loss.is_floating_point():
                flags.append(torch.isfinite(loss.detach()).all())
            device = flags[0].device
            ok = torch.stack([f.to(device) for f in flags]).all() if len(flags) > 1 else flags[0]
        return bool(ok.item())  # the one host sync

    guard._finite, guard._offenders = finite, nonfinite_params
    Optimizer = torch.optim.Optimizer
    original_init = Optimizer.__init__

    def loss_of(args, kwargs):
        return None

    def closure_of(args, kwargs):
        return bool(args) or kwargs.get("closure") is not None

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _wrap_step(type(self), "step", guard, loss_of, closure_of)
        guard.new_optimizer(self)

    set_attr(Optimizer, "__init__", __init__)
    original_backward = torch.Tensor.backward

    @functools.wraps(original_backward)
    def backward(self, *args, **kwargs):
        guard.note_loss(self)
        return original_backward(self, *args, **kwargs)

    set_attr(torch.Tensor, "backward", backward)
    return f"torch.optim.Optimizer steps guarded without a scaler (skip non-finite; max_skips={guard.max_skips})"


def install_paddle(paddle, guard: StepGuard, set_attr: Callable) -> str:
    """Guard every ``paddle.optimizer.Optimizer`` subclass's ``step`` and ``minimize(loss)``."""
    from ..paddle.grads import nonfinite_params, unscale_and_check_

    def finite(optimizer, loss) -> bool:
        found = unscale_and_check_(optimizer, paddle.ones([1], dtype="float32"))
        if loss is not None and isinstance(loss, paddle.Tensor) and loss._is_initialized():
            found = paddle.logical_or(found.reshape([1]), paddle.logical_not(paddle.isfinite(loss).all()).reshape([1]))
        return not bool(found.item())  # the one host sync

    guard._finite, guard._offenders = finite, nonfinite_params
    Optimizer = paddle.optimizer.Optimizer
    original_init = Optimizer.__init__

    def no_loss(args, kwargs):
        return None

    def minimize_loss(args, kwargs):
        return args[0] if args else kwargs.get("loss")

    def no_closure(args, kwargs):
        return False

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _wrap_step(type(self), "step", guard, no_loss, no_closure)
        # Paddle's minimize returns (optimize_ops, params_grads), which its GradScaler.minimize unpacks
        _wrap_step(type(self), "minimize", guard, minimize_loss, no_closure, skipped=lambda: (None, []))
        guard.new_optimizer(self)

    set_attr(Optimizer, "__init__", __init__)
    original_backward = paddle.Tensor.backward

    @functools.wraps(original_backward)
    def backward(self, *args, **kwargs):
        guard.note_loss(self)
        return original_backward(self, *args, **kwargs)

    set_attr(paddle.Tensor, "backward", backward)
    return f"paddle.optimizer.Optimizer step/minimize guarded without a scaler (skip non-finite; max_skips={guard.max_skips})"
