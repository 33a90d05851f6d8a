"""``ampsafe run``'s FP32 guard: every optimizer step that no ampsafe scaler guards is checked first.

An FP32 script (no GradScaler, or one disabled on a CPU) that meets one NaN batch ends with NaN parameters:
the optimizer writes the NaN gradient into every weight. Here each optimizer's ``step`` (torch) or
``step`` / ``minimize`` (Paddle) is wrapped, class by class, at its first construction; before the real step
the loss of the latest ``backward()`` and every gradient are checked by fused kernels with one host sync
(torch: ``_foreach_norm`` per device and dtype, read-only; Paddle: its ``check_finite_and_unscale`` kernel, as
its scaler), and a non-finite step is skipped: parameters and optimizer state untouched, the step counted, and the
model's buffers its forward moved (BatchNorm running statistics, ``num_batches_tracked``) put back from the
snapshot taken at the step's first forward (:class:`_Tracked`, ``Backend.snapshot``; the skip line names them).
Steps done inside an enabled ampsafe scaler's ``step`` / ``minimize`` are the scaler's: they pass through
(:func:`through_scaler`), so no step is skipped or counted twice.

* ``max_skips``: more than that many skipped steps in a row stop the run (:class:`SkippedStepsError`), since
  a diverged run would skip every later step;
* ``watch``: the first non-finite step stops the run with :class:`ampsafe.NonFiniteError`: the inputs of the
  model's latest training forward (kept by reference) are replayed under ``ampsafe.watch``, model state
  restored, which names the op, module, pass, sample and kind;
* a float16 backward with no loss scaler (float16 autocast on the step's forward, or float16 parameters in the
  optimizer: NeMo-RL's DTensor float16 path): said once, at the first such step, and recorded
  (:meth:`StepGuard.no_scaler_record`): its non-finite steps, the gradients' float16 underflow at scale 1 on the
  sampled steps (:mod:`ampsafe.core.underflow`), and the framework's lines that add a GradScaler;
* a script that stops itself on a non-finite loss before any optimizer step (torchvision's engine calls
  ``sys.exit(1)``): at exit, :meth:`StepGuard.explain_exit` replays that last forward once in float32 under
  ``ampsafe.watch``, and the summary and report name its origin (``kind='input'`` for a NaN image).

The model is the smallest module covering the optimizer's parameters (``Backend.owner_of``), as the scalers
find it. Steps are numbered from 0, as ``scaler.stats.total_steps`` counts them. Framework-neutral: the one-sync
check is the Backend's ``tensors.grads_finite`` (``watch(guard=True)`` skips by the same); what only the framework
knows (which optimizer methods step, how a closure is called, which gradients to name) is given by its
``install_run`` (:mod:`ampsafe.torch.run`, :mod:`ampsafe.paddle.run`), which gets its guard from
``ampsafe.auto`` and wraps the optimizer classes with :meth:`StepGuard.wrap_step`.
"""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..core.backend import FLOAT32
from ..core.ledger import AttrPatches
from ..errors import AmpSafeError

__all__ = ["StepGuard", "SkippedStepsError", "through_scaler", "guards", "latest_inputs"]

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


def latest_inputs(model) -> tuple[tuple, dict] | None:
    """The inputs of ``model``'s latest training forward as a guard kept them (hooked since its optimizer was
    built, so step 0's too), or None: what a run's scaler, which finds its model only at its first step, reads
    to tell a step-0 NaN input from an overflow."""
    for guard in _guards:
        tracked = guard._tracked.get(id(model)) if guard.enabled and model is not None else None
        if tracked is not None and tracked.latest is not None:
            return tracked.latest
    return None


def forward_precision(optimizer) -> str | None:
    """Why the latest training forward of ``optimizer``'s model computed in float16 (the guard's
    ``low_precision`` words, ``"float16 auto_cast O1 (emulated)"``), as a guard saw it since the step began, or
    None: what a run's scaler, which sees no forward before its first step, reads for the step's AMP level."""
    for guard in _guards:
        model = guard._known(optimizer) if guard.enabled else None
        tracked = guard._tracked.get(id(model)) if model is not None else None
        if tracked is not None and tracked.low:
            return tracked.low
    return None


def _depth(name: str) -> int:
    return getattr(_tls, name, 0)


@contextlib.contextmanager
def _inside(name: str):
    setattr(_tls, name, _depth(name) + 1)
    try:
        yield
    finally:
        setattr(_tls, name, _depth(name) - 1)


def through_scaler(guards: bool):
    """Context for a scaler's ``step`` / ``minimize``: the optimizer steps inside it are the scaler's to guard when
    it ``guards`` (enabled, or in its own FP32 guard mode); a disabled scaler guards nothing: its steps stay ours."""
    return _inside("scaler") if guards else contextlib.nullcontext()


def _weak(obj) -> Callable[[], Any]:
    """A weak reference to ``obj``; a strong one for an object that takes none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class _Replay:
    """The closure an optimizer gets after the guard has called the real one: its first call returns that result
    (the loss and gradients are already there), later calls (LBFGS' line search) evaluate the real closure."""

    __slots__ = ("_result", "_closure", "_used")

    def __init__(self, result, closure) -> None:
        self._result, self._closure, self._used = result, closure, False

    def __call__(self):
        if self._used:
            return self._closure()
        self._used = True
        return self._result


class _Tracked:
    """One guarded model's forward pre-hook: the model state (``Backend.snapshot``) at the first forward since
    its last optimizer step, and the inputs of its latest training forward.

    The snapshot is what a skip puts back: everything the skipped step's forwards moved besides parameters
    (BatchNorm running statistics, ``num_batches_tracked``). It copies the state tensors only (a few
    thousand floats on a resnet18), once per step. The inputs are kept by reference, never copied, for a
    replay: the step's origin under ``--watch``, or at exit when the script stopped itself before stepping.

    The model is held weakly: the guard watches it, the script owns it. When the script drops it, the guard
    forgets it (``guard._tracked``) and the hook goes with it.
    """

    def __init__(self, guard: StepGuard, model) -> None:
        self.guard, self.backend = guard, guard.backend
        ident, tracked = id(model), guard._tracked
        self._model = weakref.ref(model, lambda _ref: tracked.pop(ident) if tracked.get(ident) is self else None)
        self.restore: Callable[[], None] | None = None
        self.latest: tuple[tuple, dict] | None = None
        self.low: str | None = None  # why a forward of this step computed in float16 (guard.low_precision)
        self.paused = 0
        self._handle = self.backend.forward_pre_hook(model, self._pre)

    @property
    def model(self):
        """The guarded model, or None once the script dropped it."""
        return self._model()

    def _pre(self, args, kwargs) -> None:
        model = self.model
        if self.paused or not self.guard.enabled or model is None:
            return
        if self.restore is None:
            self.restore = self.backend.snapshot(model)
        if self.guard.training(model):
            self.latest = (args if isinstance(args, tuple) else tuple(args), dict(kwargs) if kwargs else {})
            self.low = self.low or self.guard.low_precision()

    def drop(self) -> None:
        """The step happened (or was skipped and restored): the next forward starts the next step."""
        self.restore = self.latest = self.low = None

    def remove(self) -> None:
        self.drop()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _values(backend, t) -> np.ndarray | None:
    """A copy of ``t``'s values (float state through the backend; an integer counter such as BatchNorm's
    ``num_batches_tracked`` through ``tolist``), or None when they cannot be read."""
    a = backend.tensors.to_numpy(t)
    if a is not None:
        return a.copy()  # to_numpy may share memory
    try:
        return np.asarray(t.tolist())
    except Exception:  # noqa: BLE001 - a tensor that cannot be read is not compared
        return None


class StepGuard:
    """The guard of one framework's optimizers.

    ``backend``: the framework's :class:`~ampsafe.core.backend.Backend`, whose ``tensors.grads_finite`` decides
    a skip (the loss and every gradient the optimizer updates finite, one host sync: the check
    ``watch(guard=True)`` makes too); ``offenders(optimizer) -> [(param, label)]``: the parameters with
    non-finite gradients (rare path); ``patches``: where :meth:`wrap_step` records the optimizer
    classes it wraps (``ampsafe run``'s ledger, so that its uninstall puts their methods back).
    """

    def __init__(
        self,
        backend,
        offenders: Callable,
        *,
        max_skips: int = 10,
        watch: bool = False,
        say: Callable[[str], None] = lambda _m: None,
        patches: AttrPatches | None = None,
        underflow_every: int = 0,
    ):
        self.backend, self._offenders = backend, offenders
        self._patches = patches if patches is not None else AttrPatches("ampsafe.run.guard")
        self.max_skips, self.watch, self._say = max_skips, watch, say
        self.enabled = True
        self.total_steps = 0
        self.skipped_steps = 0
        self.in_a_row = 0
        self.skipped_at: list[int] = []
        self.offender_names: list[str] = []
        self.scaler_steps = 0  # optimizer steps an ampsafe scaler guarded (passed through)
        self.unchecked_steps = 0  # optimizer steps that ran past both (see saw_step)
        self.call_closure: Callable = lambda closure: closure()  # the framework's way (torch: grad enabled)
        self.is_loss: Callable = lambda value: value is not None  # a closure result that is the step's loss
        self.training: Callable[[Any], bool] = lambda model: True  # a training forward (adapters: mode, grad)
        self.restored: list[str] = []  # what the last skip put back (state tensor names)
        self.exit_origin: dict | None = None  # what a replay at exit found (the script stopped before stepping)
        # a float16 backward with no scaler: the adapters say whether a forward runs in float16 now (its autocast,
        # an emulator) and give the lines that add their GradScaler, ``add_scaler(optimizer) -> dict``
        self.low_precision: Callable[[], str | None] = lambda: None
        self.add_scaler: Callable[[Any], dict | None] = lambda optimizer: None
        self.underflow_every = underflow_every  # sample the underflow of such steps (0: never)
        self.no_scaler: dict | None = None  # the record once seen (no_scaler_record)
        self._underflow: Any = None  # its UnderflowSeries
        self._half: dict[int, bool] = {}  # id(optimizer) -> float16 parameters in it
        # id(optimizer) -> (weakref(optimizer), weakref(model) or None, the model's class name): weak, so that a
        # model the script dropped is freed (a sweep builds many); the name stays for the summary
        self._models: dict[int, tuple] = {}
        self._tracked: dict[int, _Tracked] = {}  # id(model) -> its forward pre-hook (snapshot, inputs)
        self._announced: set[int] = set()
        self._loss = None
        _guards.append(self)

    # -- what the adapters call
    def wrap_step(self, cls, name: str, *, loss_of: Callable, closure_of: Callable, skipped: Any = None) -> None:
        """Guard ``cls.<name>``, an optimizer class's step method (``step``, Paddle's ``minimize``), once: a method
        this guard or another wrapped before (here or on a base class) is left alone. ``loss_of(args, kwargs)``:
        the loss the call was given, if any; ``closure_of(args, kwargs)``: its closure, if any; a skipped step
        returns ``skipped`` (see :meth:`step`)."""
        guard = self

        def make(original):
            def guarded(optimizer, *args, **kwargs):
                def run(closure=None):  # the real step; with ``closure``, the step's closure replaced by it
                    if closure is None:
                        return original(optimizer, *args, **kwargs)
                    if args:
                        return original(optimizer, closure, *args[1:], **kwargs)
                    return original(optimizer, *args, **{**kwargs, "closure": closure})

                closure = closure_of(args, kwargs)
                return guard.step(optimizer, run, loss_of(args, kwargs), closure=closure, skipped=skipped)

            return guarded

        self._patches.wrap(cls, name, make, mark="__ampsafe_guard__")

    def note_loss(self, loss) -> None:
        """The tensor a ``backward()`` started from (the step's loss, checked with the gradients)."""
        self._loss = loss

    def guard_new_optimizers(self, optimizer_class: type, wrap_class: Callable[[type], None]) -> None:
        """Wrap ``optimizer_class.__init__`` (recorded in the ledger): every optimizer built has its class's step
        methods wrapped by ``wrap_class(type(optimizer))`` (once per class, :meth:`wrap_step`) and its model found
        now (:meth:`new_optimizer`). Wrapping at construction puts the guard outside a framework's own step
        wrapper (torch's profiler and step hooks)."""
        guard = self

        def make(original):
            def __init__(optimizer, *args, **kwargs):
                original(optimizer, *args, **kwargs)
                wrap_class(type(optimizer))
                guard.new_optimizer(optimizer)

            return __init__

        self._patches.wrap(optimizer_class, "__init__", make, mark="__ampsafe_init__")

    def note_losses(self, tensor_class: type) -> None:
        """Wrap ``tensor_class.backward`` (recorded in the ledger) so that every backward notes its tensor
        (:meth:`note_loss`): a step without a scaler never hands its loss to the optimizer."""
        guard = self

        def make(original):
            def backward(tensor, *args, **kwargs):
                guard.note_loss(tensor)
                return original(tensor, *args, **kwargs)

            return backward

        self._patches.wrap(tensor_class, "backward", make, mark="__ampsafe_loss__")

    def new_optimizer(self, optimizer) -> None:
        """Find the model now and hook its forward, so that even step 0 has its snapshot and inputs."""
        if self.enabled:
            self._model_of(optimizer)

    def step(self, optimizer, run: Callable[..., Any], loss=None, *, closure: Any = None, skipped: Any = None):
        """``run()`` (the real step) unless the loss or a gradient is non-finite; ``skipped`` (or ``skipped()``) when
        skipped (what the caller may unpack: Paddle's ``minimize`` returns ``(optimize_ops, params_grads)``).

        ``closure``: the step's closure (``step(closure)``; None for a plain step, ``step(None)`` included). The
        closure computes the loss and gradients, so the guard calls it once itself (:attr:`call_closure`), checks
        its result and the gradients, and either skips the step (returning the closure's result, as an optimizer's
        step does) or runs it as ``run(replay)``: ``replay`` hands the optimizer that result at its first call
        and calls the real closure only at later ones (LBFGS re-evaluates), so no closure call is doubled."""
        if not self.enabled or _depth("step"):
            return run()
        if _depth("scaler"):
            self.scaler_steps += 1
            self._drop(self._known(optimizer))
            with _inside("accounted"):
                return run()
        with _inside("step"):
            self._refine(optimizer)
            model = self._model_of(optimizer)
            if model is not None and id(model) not in self._announced:
                self._announced.add(id(model))
                self._say(f"guarding the optimizer steps of {type(model).__name__} (FP32 guard)")
            try:
                result = None
                if closure is not None:
                    self._loss = None
                    result = self.call_closure(closure)
                    loss = result if self.is_loss(result) else loss
                loss = loss if loss is not None else self._loss
                self._loss = None
                finite = self.backend.tensors.grads_finite(self.backend.optimizer_params(optimizer), loss)
                index = self.total_steps
                self.total_steps += 1
                self._float16_step(optimizer, model, index, finite)
                if finite:
                    self.in_a_row = 0
                    with _inside("accounted"):
                        return run() if closure is None else run(_Replay(result, closure))
                self._skip(optimizer, index, model, loss)
                if closure is not None:
                    return result
                return skipped() if callable(skipped) else skipped
            finally:
                self._drop(model)

    def _float16_step(self, optimizer, model, index: int, finite: bool) -> None:
        """A step without a scaler whose backward ran in float16: say so at the first, count its non-finite steps,
        measure the gradients' underflow (scale 1) on the sampled steps. Advice only: a failure never stops the
        step."""
        try:
            tracked = self._tracked.get(id(model)) if model is not None else None
            why = tracked.low if tracked is not None else None
            why = why or self._float16_params(optimizer)
            if why is None:
                return
            if self.no_scaler is None:
                self._first_float16_step(optimizer, index, why)
            record = self.no_scaler
            record["steps"] += 1
            if not finite:
                record["nonfinite_steps"].append(index)
            every = self.underflow_every
            if every and (index < every or index % every == 0):
                self._underflow.measure(self.backend, model, 1.0, index)
        except Exception as exc:  # noqa: BLE001 - the record is advice: the step goes on
            self._say(f"step {index}: could not measure the float16 step: {type(exc).__name__}: {exc}")

    def _float16_params(self, optimizer) -> str | None:
        key = id(optimizer)
        if key not in self._half:
            ts = self.backend.tensors
            self._half[key] = any(ts.describe(p)[1] == "float16" for p in self.backend.optimizer_params(optimizer))
        return "float16 parameters" if self._half[key] else None

    def _first_float16_step(self, optimizer, index: int, why: str) -> None:
        from .underflow import UnderflowSeries

        message = (
            f"step {index}: a float16 backward with no loss scaler ({why}): gradients below 6e-8 flush to zero and "
            "nothing skips an overflowing step; the FP32 guard skips non-finite steps and measures the underflow, "
            "and the report gives the lines that add a GradScaler"
        )
        self._say(message)
        try:
            lines = self.add_scaler(optimizer)
        except Exception:  # noqa: BLE001 - the lines are advice
            lines = None
        self._underflow = UnderflowSeries(self.underflow_every)
        model = self._known(optimizer)
        if model is not None and self.backend.sharding.forward_is_collective(model):
            self._underflow.note = "not measured: the gradients are sharded across ranks (FSDP2)"
        self.no_scaler = {
            "step": index,
            "why": why,
            "message": message,
            "steps": 0,
            "nonfinite_steps": [],
            "lines": lines,
        }

    def no_scaler_record(self) -> dict | None:
        """The float16-without-a-scaler record (:class:`~ampsafe.run.records.NoScaler` as a dict), or None."""
        if self.no_scaler is None:
            return None
        record = dict(self.no_scaler, nonfinite_steps=list(self.no_scaler["nonfinite_steps"][-100:]))
        if self.underflow_every and self._underflow is not None:
            record["underflow"] = self._underflow.record().to_dict()
        return record

    def _refine(self, optimizer) -> None:
        """At an optimizer's first step, once: the model found at its construction is the smallest module that
        covers its parameters; now the step's forward has run, the backend may name the module it called
        (ultralytics' DetectionModel, not its inner Sequential). Hook that one from now on."""
        refined = self.__dict__.setdefault("_refined", set())
        if id(optimizer) in refined:
            return
        refined.add(id(optimizer))
        try:
            called = self.backend.owner_of(optimizer)
        except Exception:  # naming and replay only
            return
        if called is not None and called is not self._known(optimizer):
            self._models.pop(id(optimizer), None)
            self._model_of(optimizer)

    def saw_step(self) -> None:
        """An optimizer step is running (a framework-wide step hook): counted as unchecked when it is neither a
        step this guard let through nor one inside an ampsafe scaler."""
        if self.enabled and not _depth("accounted"):
            self.unchecked_steps += 1

    def models(self) -> list:
        """The models found for the optimizers seen so far (owner of each optimizer's parameters)."""
        return [m for _opt, ref, _name in self._models.values() if ref is not None and (m := ref()) is not None]

    # -- internals
    def _drop(self, model) -> None:
        tracked = self._tracked.get(id(model)) if model is not None else None
        if tracked is not None:
            tracked.drop()

    def _known(self, optimizer):
        """The model found for ``optimizer`` so far (None: not looked for yet, none found, or dropped since)."""
        entry = self._models.get(id(optimizer))
        if entry is None or entry[0]() is not optimizer or entry[1] is None:
            return None
        return entry[1]()

    def _model_of(self, optimizer):
        key = id(optimizer)
        entry = self._models.get(key)
        if entry is not None and entry[0]() is optimizer:
            return entry[1]() if entry[1] is not None else None
        try:
            model = self.backend.owner_of(optimizer)
        except Exception:  # finding the model is for naming and replay only: the guard works without it
            model = None
        ref = _weak(model) if model is not None else None
        self._models[key] = (_weak(optimizer), ref, type(model).__name__ if model is not None else None)
        if model is not None and id(model) not in self._tracked:
            try:
                self._tracked[id(model)] = _Tracked(self, model)
            except Exception as exc:  # a model that takes no forward hook: skips restore parameters only
                self._say(f"cannot hook {type(model).__name__}'s forward ({exc}): a skip restores no buffers")
        return model

    def _restore(self, model) -> list[str]:
        """Put back the state the skipped step's forwards moved; the names of the tensors that had changed."""
        tracked = self._tracked.get(id(model)) if model is not None else None
        if tracked is None or tracked.restore is None:
            return []
        b = self.backend
        state = b.state_tensors(model)
        before = [_values(b, t) for t in state]
        tracked.restore()
        names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        changed = []
        for t, old in zip(state, before):
            new = _values(b, t)
            if old is None or new is None or old.shape != new.shape:
                continue
            same = (old == new) | (np.isnan(old) & np.isnan(new))
            if not same.all():
                changed.append(names.get(id(t), "?"))
        tracked.restore = b.snapshot(model)  # the restored state is the step's start again
        return changed

    def explain_exit(self) -> dict | None:
        """At exit: a model whose latest training forward no optimizer step followed (the script stopped itself,
        e.g. on a non-finite loss) is replayed once in float32 under ``ampsafe.watch``; what it names, or None."""
        import ampsafe

        for tracked in list(self._tracked.values()):
            model, b = tracked.model, self.backend
            if tracked.latest is None or model is None:
                continue
            if b.sharding.forward_is_collective(model):  # a forward that other ranks, maybe gone, must join would hang
                tracked.latest = None
                self._say(
                    "the last forward was not replayed at exit: every forward of this model is collective "
                    "(FSDP2's all-gathers) and the other ranks may have stopped"
                )
                continue
            args, kwargs = tracked.latest
            step = self.total_steps + self.scaler_steps  # the optimizer step that never came
            tracked.paused += 1
            try:
                watcher = ampsafe.watch(model, backward=False)
                watcher.step_source = lambda step=step: step
                with b.replay(model, FLOAT32), watcher:
                    model(*args, **kwargs)
            except ampsafe.NonFiniteError as exc:
                self.exit_origin = _origin(exc, step, "replayed in float32 at exit")
            except Exception as exc:  # the replay is diagnosis only: never turn an exit into a new failure
                self._say(f"could not replay the last forward at exit: {type(exc).__name__}: {exc}")
            finally:
                tracked.paused -= 1
                tracked.latest = None
            if self.exit_origin is not None:
                o = self.exit_origin
                self._say(
                    f"the script stopped before optimizer step {o['step']}; its last forward, replayed in float32: "
                    f"{o['kind']} at {o['module'] or '<root>'}:{o['op']}"
                    f"{', sample ' + str(o['sample']) if o.get('sample') is not None else ''}"
                    f"{' (' + o['where'] + ')' if o.get('where') else ''}"
                )
                return self.exit_origin
        return None

    def _names(self, optimizer, model) -> list[str]:
        found = self._offenders(optimizer)
        names = {id(p): n for n, p in (model.named_parameters() if model is not None else [])}
        return [names.get(id(p), label) for p, label in found]

    def _skip(self, optimizer, index: int, model, loss=None) -> None:
        self.skipped_steps += 1
        self.in_a_row += 1
        self.skipped_at.append(index)
        try:
            self.offender_names = self._names(optimizer, model)
        except Exception:
            self.offender_names = []
        where = f"; non-finite gradients: {', '.join(self.offender_names[:5])}" if self.offender_names else ""
        more = f" (+{len(self.offender_names) - 5} more)" if len(self.offender_names) > 5 else ""
        try:
            self.restored = self._restore(model)
        except Exception as exc:  # restoring is best effort: the skip itself already protected the parameters
            self.restored = []
            self._say(f"step {index}: could not restore the model's buffers: {type(exc).__name__}: {exc}")
        put_back = (
            f"; {len(self.restored)} state tensor(s) its forward had changed restored: "
            f"{', '.join(self.restored[:6])}{', …' if len(self.restored) > 6 else ''}"
            if self.restored
            else ""
        )
        self._say(
            f"step {index}: non-finite loss or gradients, step skipped (parameters and optimizer state untouched"
            f"{put_back}){where}{more}"
        )
        if self.watch:
            self._replay(index, model, self._finite(loss))
        if self.in_a_row > self.max_skips:
            raise SkippedStepsError(
                f"{self.in_a_row} optimizer steps in a row (steps {self.skipped_at[-self.in_a_row]}-{index}) had a "
                f"non-finite loss or gradients and were skipped{where}{more}: the run has diverged or its data "
                "keeps producing NaN. Run again with `ampsafe run --watch` to stop at the first such step with its "
                "origin (op, module, sample), or `--max-skips K` to ride out a longer bad stretch",
                steps=self.skipped_at[-self.in_a_row :],
                offenders=self.offender_names,
            )

    def _finite(self, loss) -> bool | None:
        """Whether the step's loss was finite (None: no loss tensor was seen)."""
        ts = self.backend.tensors
        return bool(ts.finite(loss)) if isinstance(loss, ts.tensor_type) else None

    def _replay(self, index: int, model, loss_finite: bool | None = None) -> None:
        """``watch``: replay the latest forward under ``ampsafe.watch`` (state restored) and raise what it names;
        when the forward replays finite, what that and the step's loss and gradients say (no placeholder op)."""
        from ..core.sentinel import UNKNOWN
        from ..errors import NonFiniteError

        tracked = self._tracked.get(id(model)) if model is not None else None
        latest = tracked.latest if tracked is not None else None
        if latest is not None:
            import ampsafe

            args, kwargs = latest
            watcher = ampsafe.watch(model)
            # its forward count numbers the pass as the step (the count starts at the pass entered)
            if hasattr(watcher, "_forward_count"):
                watcher._forward_count = index
            try:
                with self.backend.replay(model), watcher:
                    model(*args, **kwargs)
            except ampsafe.NonFiniteError as exc:
                exc.add_note(
                    f"ampsafe run --watch: optimizer step {index} was skipped; the replay of its forward "
                    "found this origin"
                )
                raise
            forward = "its forward, replayed under ampsafe.watch, is finite"
        else:
            forward = "the model's inputs for this step were not captured, so its forward was not replayed"
        names = ", ".join(self.offender_names[:5]) + (", …" if len(self.offender_names) > 5 else "")
        grads = f"non-finite gradients: {names}" if names else "no parameter named"
        if latest is None:
            loss = {True: "finite", False: "non-finite", None: "not seen"}[loss_finite]
            phase, what = "backward", f"the loss was {loss}, and the pass that went non-finite was not measured"
        elif loss_finite is False:
            phase, what = (
                "loss",
                (
                    "the loss is non-finite: it went non-finite outside the model's forward (a log, division or exp "
                    "of its outputs: guard that op with a clamp or eps), or the replay did not reproduce the step"
                ),
            )
        elif loss_finite:
            phase, what = (
                "backward",
                (
                    "the loss is finite and gradients are not: the backward pass went non-finite (a numerical error "
                    "in a backward op); ampsafe.watch(model) around that step's loss.backward() names the op"
                ),
            )
        else:
            phase, what = "backward", "no loss tensor was seen, so the loss and the backward were not told apart"
        message = f"optimizer step {index} skipped by ampsafe run's FP32 guard: {forward}; {what} ({grads})"
        raise NonFiniteError(message, phase=phase, module="", op="", kind=UNKNOWN)

    def to_dict(self) -> dict:
        models = {name for _opt, _ref, name in self._models.values() if name is not None}
        return {
            "framework": self.backend.name,
            "model": ", ".join(sorted(models)) or None,
            "total_steps": self.total_steps,
            "skipped_steps": self.skipped_steps,
            "skipped_at": list(self.skipped_at[-100:]),
            "offenders": list(self.offender_names),
            "scaler_steps": self.scaler_steps,
            "unchecked_steps": self.unchecked_steps,
            "max_skips": self.max_skips,
            "restored": list(self.restored),
            "exit_origin": self.exit_origin,
            "no_scaler": self.no_scaler_record(),
        }


def _origin(exc, step: int, how: str) -> dict:
    """A NonFiniteError as the summary and the report keep it (``where``: the input or tensor its message names)."""
    where = re.search(r" \[(.+?)\]: kind=", str(exc))
    return {
        "step": step,
        "phase": exc.phase,
        "module": exc.module,
        "op": exc.op,
        "kind": exc.kind,
        "sample": exc.sample,
        "where": where.group(1) if where else "",
        "how": how,
        "message": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
    }
