"""The watch object both ``ampsafe.watch`` adapters share: everything but moving tensors and hooking ops.

Why: the torch and Paddle watchers differ in how they see an op (a ``TorchFunctionMode`` / an
``intercept.OpMode``) and in their backward hooks; the rest (root-forward bookkeeping, the scan of the model
inputs, the origin report, the guard's check and replay, when the headroom is measured) is one logic. It lives
here, reading the framework through its :class:`~ampsafe.core.backend.Backend` (tensors, model state and RNG,
module paths, forward hooks), so a fix lands once for both frameworks. The guard (:mod:`ampsafe.core.watch_guard`)
is a mixin of :class:`WatchBase`; the headroom is the core's :class:`~ampsafe.core.headroom.HeadroomMonitor` under
its threshold rule, its modules chosen by the scan function passed in. Pure Python: importing it imports neither
torch nor paddle.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple

from ..errors import ConfigError, NonFiniteError
from .backend import Backend, Tensors
from .capture import example_inputs
from .headroom import HeadroomMonitor, ThresholdRule
from .sentinel import INPUT, PARAMETER, UNKNOWN, first_nonfinite_row, log, nonfinite_error, tensor_stats, verdict
from .watch_guard import Guard

__all__ = ["map_nested", "WatchPass", "WatchBase", "Snapshot"]


def map_nested(obj, leaf: Callable, depth: int = 0):
    """``obj`` with ``leaf`` applied to everything but lists/tuples/dicts (3 levels deep), e.g. to upcast."""
    if depth < 3 and isinstance(obj, (list, tuple)):
        return type(obj)(map_nested(x, leaf, depth + 1) for x in obj)
    if depth < 3 and isinstance(obj, dict):
        return {k: map_nested(v, leaf, depth + 1) for k, v in obj.items()}
    return leaf(obj)


class Snapshot(NamedTuple):
    """The random state and the model's state (buffers, statistics) before a step: each field restores its part."""

    rng: Callable[[], None]
    state: Callable[[], None]

    def restore(self) -> None:
        self.rng()
        self.state()


class WatchPass:
    """One forward pass (and the backward of its graph): what was found, and what it needs to find more."""

    def __init__(self, step: int):
        self.step = step
        self.batch_size: int | None = None
        self.bad_inputs: list[tuple[str, int | None, int]] = []  # (where, sample, tensors.key of the tensor)
        self.forward_event: NonFiniteError | None = None
        self.backward_event: NonFiniteError | None = None
        # origins not reported yet (see WatchBase.defers_origin): tensors.key of a non-finite tensor -> its origin
        self.carried: dict = {}
        self.candidates: list[NonFiniteError] = []

    @property
    def done(self) -> bool:
        return self.forward_event is not None or self.backward_event is not None

    def release(self) -> None:
        """Drop what the pass kept alive (hooked tensors, graph nodes). Their gradient hooks refer back to the
        pass through the framework's C++ graph, a cycle Python's collector cannot see: without this every
        step's activations would stay alive."""
        for value in vars(self).values():
            if isinstance(value, dict):
                value.clear()


# ------------------------------------------------------------------------------------------- the watch object
@dataclass
class WatchBase(Guard):
    """State and logic shared by the torch and paddle watchers: root-forward bookkeeping, the input scan, the
    origin report, the guard (check / replay), the headroom monitor, raise-or-record.

    ``backend`` is the framework's Backend (the tensor facts, the guard's one-sync check ``tensors.grads_finite``,
    snapshots of the model's state and the RNG, module paths, forward hooks), handed in by ``Backend.watch``.
    Adapters supply only the interception of one watch: the op interception and the backward hooks
    (``_full_hooks``), ``_root_handles``, ``_rerun``, what the guard's replay does with the step's gradients
    (``_stash_grads``) and ``_training_forward``.
    """

    model: object
    on_nonfinite: str = "raise"
    guard: bool = False
    monitor_every: int | None = None
    margin_bits: float = 4.0
    callback: Callable | None = None
    backward: bool = True
    scan: Callable | None = None  # scan(model, example_inputs, margin_bits=) -> ScanReport, for the monitor
    events: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    # origins of non-finite values nothing carried to what always counts, by pass (see defers_origin): not
    # events, but what a caller that saw the backward go non-finite names (a forward-only replay at the floor)
    deferred: list = field(default_factory=list)
    step_count: int = 0
    # the step number of a pass: the optimizer steps done so far (``ampsafe run`` passes its scaler's count);
    # without it, training forwards are counted (eval(), no_grad and inference_mode forwards are not)
    step_source: Callable[[], int] | None = None
    backend: Backend | None = None  # the framework's Backend: ``Backend.watch`` hands itself in
    # An origin is reported when a non-finite value it made reaches what always counts (the model's output, a
    # scalar loss, a backward, a parameter), not when the op runs: T5's position bucketing takes log(0) and
    # throws those lanes away with torch.where. Adapters that call carry() / reaches() set it.
    defers_origin: ClassVar[bool] = False
    _input_label: ClassVar[str] = "args"  # how unnamed model inputs are spelled in messages ("args[0]")
    _grad_what: ClassVar[str] = "a gradient norm"  # what the guard's fused check read, for its message

    def __post_init__(self):
        if self.on_nonfinite not in ("raise", "record"):
            raise ConfigError(f"on_nonfinite must be 'raise' or 'record', got {self.on_nonfinite!r}")
        if self.monitor_every is not None and (not isinstance(self.monitor_every, int) or self.monitor_every < 1):
            raise ConfigError(f"monitor_every must be a positive int or None, got {self.monitor_every!r}")
        if not math.isfinite(self.margin_bits):
            raise ConfigError(f"margin_bits must be finite, got {self.margin_bits!r}")
        self._full: ExitStack | None = None  # the full hooks (op interception, backward), when installed
        self._handles: list = []  # root hooks, removed on exit
        self._pass: WatchPass | None = None
        self._phase = "idle"  # idle | forward | loss
        self._depth = 0  # nesting of root forwards
        self._suspended = 0  # > 0 while the watcher itself computes (re-runs, scans): ops are not checked
        self._replaying = False
        self._forward_count = 0
        self._snapshot: Snapshot | None = None
        self._signature = None  # the model's forward signature, to name its inputs
        self._monitor: HeadroomMonitor | None = None  # once the first monitored forward chose its paths
        self._active = False
        self._param_keys: dict[int, str] = {}  # tensors.key of each parameter / buffer -> its name

    @property
    def tensors(self) -> Tensors:
        return self.backend.tensors

    # -- what adapters call
    def report(self, error: NonFiniteError) -> None:
        """Record the event and tell the callback; raise it when ``on_nonfinite="raise"``."""
        self.events.append(error)
        if self.on_nonfinite == "record":
            log.error("%s", error)
        if self.callback is not None:
            self.callback(error)
        if self.on_nonfinite == "raise":
            raise error

    def _float_tensors(self, obj) -> list:
        return self.tensors.checkable_leaves(obj)

    # -- context
    def __enter__(self):
        self._handles = self._root_handles()
        self._active = True
        if not self.guard:
            self._install_full()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._active = False
        try:
            self._remove_full()
            if self._monitor is not None:
                self._monitor.close()
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            if self._pass is not None:
                if not self._pass.done:
                    self.deferred.extend(self._pass.candidates)
                self._pass.release()
            self._pass = None  # drop the last step's graph (its autograd nodes / hooked tensors)
        return False

    def _install_full(self) -> None:
        if self._full is not None:
            return
        named = [*self.model.named_parameters(), *self.model.named_buffers()]
        self._param_keys = {self.tensors.key(t): n for n, t in named}
        self._full = self._full_hooks()

    def _remove_full(self) -> None:
        if self._full is not None:
            full, self._full = self._full, None
            full.close()
        self._phase = "idle"

    # -- root forward
    def _root_pre(self, args, kwargs) -> None:
        if self._suspended:
            return
        self._depth += 1
        if self._depth > 1:
            return
        if self.step_source is not None:
            step = self.step_source()
        else:
            step = self._forward_count - 1 if self._replaying else self._forward_count
        if not self._replaying:
            if self._training_forward():
                self._forward_count += 1
            if self.guard and self._snapshot is None:
                self._snapshot = self._take_snapshot()
            if self.monitored(step):
                self._monitor_begin(args, kwargs, step)
        if self._full is not None:
            if self._pass is not None:
                self._pass.release()
            self._pass = self._new_pass(step)
            self._phase = "forward"
            self._suspended += 1
            try:
                for name, value in self._named_inputs(args, kwargs):
                    self._scan_value(name, value, None, 0)
            finally:
                self._suspended -= 1

    def _root_post(self, output=None) -> None:
        """``output``: what the root forward returned (an adapter that defers origins passes it)."""
        if self._suspended:
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        self._suspended += 1
        try:
            self._monitor_end()
        finally:
            self._suspended -= 1
        p = self._pass
        if self._full is not None and p is not None and self._pass_open():
            self._phase = "loss"
            if output is not None:
                self.reaches(output)
            if p.bad_inputs and not p.done:  # the bad data never reached a floating op: blame the input
                where, sample, _ = p.bad_inputs[0]
                err = nonfinite_error(
                    phase="forward", module="", op="input", kind=INPUT, sample=sample, where=where, step=p.step
                )
                p.forward_event = err
                self.report(err)

    def _new_pass(self, step: int) -> WatchPass:
        return WatchPass(step)

    def _pass_open(self) -> bool:
        """Whether the root's end still closes a forward pass (an adapter may have closed it on a raise)."""
        return True

    def _named_inputs(self, args, kwargs) -> list[tuple[str, object]]:
        named: list[tuple[str, object]]
        try:
            bound = self._signature.bind(*args, **kwargs) if self._signature else None
            named = list(bound.arguments.items()) if bound else []
        except TypeError:
            bound = None
        if not bound:
            named = [(f"{self._input_label}[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
        return named

    def _scan_value(self, where: str, value, sample, depth: int) -> None:
        """Record the non-finite model inputs (their sample row) and the batch size of this pass."""
        p, ts = self._pass, self.tensors
        if isinstance(value, ts.tensor_type):
            if not ts.is_float(value):
                return
            if p.batch_size is None and value.ndim and depth == 0:
                p.batch_size = int(value.shape[0])
            if not ts.finite(value):
                row = first_nonfinite_row(ts.to_numpy(value), int(value.shape[0]) if value.ndim else None)
                if sample is None:
                    sample = row
                    where += f"[{row}]" if row is not None else ""
                elif row is not None:
                    where += f" row {row}"
                p.bad_inputs.append((where, sample, ts.key(value)))
        elif isinstance(value, (list, tuple)) and depth < 3:
            if (
                depth == 0
                and p.batch_size is None
                and value
                and all(isinstance(v, (ts.tensor_type, dict)) for v in value)
            ):
                p.batch_size = len(value)
            for i, v in enumerate(value):
                self._scan_value(f"{where}[{i}]", v, i if sample is None and depth == 0 else sample, depth + 1)
        elif isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                # a dict of batched arrays (ppdet's inputs): its values are batched like top-level tensors
                self._scan_value(f"{where}[{k!r}]", v, sample, depth + 1 if depth else 0)

    # -- forward origin
    def _report_origin(
        self, module: str, op: str, inputs: list, input_ok: list, outputs: list, *, low: bool, rerun: tuple, dtype: str
    ) -> None:
        """Report the op whose outputs went non-finite: its verdict, the sample, the stats.

        ``rerun``: (whether the op's float32 re-run was finite, or None when it did not run; why it could not run,
        :func:`~ampsafe.core.sentinel.rerun_failure`, or ""): with a reason the kind is ``"unknown"`` and the
        message says so instead of guessing.
        """
        rerun_finite, rerun_error = rerun
        p, ts = self._pass, self.tensors
        bad_in = [t for t, ok in zip(inputs, input_ok) if not ok]
        from_param = any(ts.key(t) in self._param_keys for t in bad_in)
        kind = verdict(low, all(input_ok), rerun_finite, from_param=from_param, rerun_failed=bool(rerun_error))
        where, sample = self._origin_where(kind, bad_in)
        if sample is None and kind != PARAMETER:
            bad_out = next(t for t in outputs if not ts.finite(t))
            sample = first_nonfinite_row(ts.to_numpy(bad_out), p.batch_size)
        stats = {
            "inputs": [tensor_stats(ts.to_numpy(t)) for t in inputs[:4]],
            "outputs": [tensor_stats(ts.to_numpy(t)) for t in outputs[:4]],
            "rerun_float32_finite": rerun_finite,
        }
        err = nonfinite_error(
            phase="forward",
            module=module,
            op=op,
            kind=kind,
            sample=sample,
            stats=stats,
            dtype=dtype,
            where=where,
            step=p.step,
            reason=rerun_error if kind == UNKNOWN else "",
        )
        if self.defers_origin and kind not in (INPUT, PARAMETER):
            p.candidates.append(err)
            for t in outputs:
                if not ts.finite(t):
                    p.carried[ts.key(t)] = err
            return
        p.forward_event = err
        self.report(err)

    def carry(self, inputs: list, outputs: list) -> bool:
        """Non-finite ``outputs`` made from a non-finite input an origin is known for carry that origin on.
        False when no bad input carries one (then the op is checked as an origin itself)."""
        p, ts = self._pass, self.tensors
        bad = [t for t in inputs if not ts.finite(t)]
        err = next((p.carried[ts.key(t)] for t in bad if ts.key(t) in p.carried), None)
        if err is None and p.candidates:
            # made by ops the watch could not see, from an origin it knows: not the data, not a parameter
            outside = {b[2] for b in p.bad_inputs} | set(self._param_keys)
            err = p.candidates[-1] if not any(ts.key(t) in outside for t in bad) else None
        if err is None:
            return False
        for o in outputs:
            if not ts.finite(o):
                p.carried[ts.key(o)] = err
        return True

    def reaches(self, tensors) -> None:
        """``tensors`` reach what always counts (the model's output, the loss, a backward, a parameter): report the
        origin of the first non-finite one. Origins whose values nothing carried there are never reported."""
        p, ts = self._pass, self.tensors
        if p is None or p.done or not p.candidates:
            return
        self._suspended += 1
        try:
            bad = next((t for t in self._float_tensors(tensors) if not ts.finite(t)), None)
        finally:
            self._suspended -= 1
        if bad is not None:
            err = p.carried.get(ts.key(bad)) or p.candidates[0]
            p.forward_event = err
            self.report(err)

    def _origin_where(self, kind: str, bad_in: list) -> tuple[str, int | None]:
        """(where, sample) of an input or parameter origin: the model input the op read (matched by data),
        or the names of the non-finite parameters."""
        p, key = self._pass, self.tensors.key
        where, sample = "", None
        if kind == INPUT:
            keys = {key(t) for t in bad_in}
            match = [b for b in p.bad_inputs if b[2] in keys] or p.bad_inputs
            if match:
                where, sample, _ = match[0]
        elif kind == PARAMETER:
            where = ", ".join(sorted({self._param_keys[key(t)] for t in bad_in if key(t) in self._param_keys}))
        return where, sample

    # -- what adapters supply (see the class docstring)
    def _training_forward(self) -> bool:
        """Whether the forward starting now is a training one (a step's): adapters read the mode and autograd."""
        return True

    # -- the headroom monitor, every ``monitor_every``-th forward
    def monitored(self, step: int) -> bool:
        """Whether forward number ``step`` (0-based) is a monitored step (0, N, 2N, ...)."""
        return self.monitor_every is not None and step % self.monitor_every == 0

    def _monitor_begin(self, args, kwargs, step: int) -> None:
        if self._monitor is None:
            rule = ThresholdRule(self.margin_bits, self._emit_headroom)
            self._monitor = HeadroomMonitor(
                self.backend, self.model, rules=(rule,), counts=self._counts, quiet=self._quiet
            )
            self._choose_paths(args, kwargs)
        self._monitor.arm(step)

    def _monitor_end(self) -> None:
        monitor = self._monitor
        if monitor is not None and monitor.armed_for is not None:
            monitor.collect(monitor.armed_for)

    def _choose_paths(self, args, kwargs) -> None:
        """The unnormalized paths ``self.scan`` finds on this step's inputs (state restored), or every conv/linear
        output where there is no scan."""
        if self.scan is None:
            log.warning("ampsafe.watch: no scan function given; monitoring every conv/linear output")
            self._monitor.track_conv_linear()
            return
        with self._quiet(), self.backend.replay(self.model):
            try:
                example = example_inputs(self.model, (args, kwargs))
                self._monitor.track_scan(self.scan(self.model, example, margin_bits=self.margin_bits))
            except Exception as exc:  # noqa: BLE001 - no scan: watch every conv/linear output instead
                log.warning("ampsafe.watch: scan unavailable (%s); monitoring every conv/linear output", exc)
                self._monitor.track_conv_linear()

    def _emit_headroom(self, warning) -> None:
        self.warnings.append(warning)
        log.warning("%s", warning.message)
        if self.callback is not None:
            self.callback(warning)

    def _counts(self, _module) -> bool:
        """A forward the watcher runs itself (a scan, a replay) is not measured."""
        return not self._suspended

    @contextmanager
    def _quiet(self):
        """The watcher computes: the ops it runs are not the model's."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def _take_snapshot(self) -> Snapshot:
        """The RNG and the model's state now: the guard replays a step from them, the monitor's scan puts both back."""
        return Snapshot(self.backend.rng_state(), self.backend.snapshot(self.model))

    def _root_handles(self) -> list:  # pragma: no cover - adapters
        raise NotImplementedError

    def _full_hooks(self) -> ExitStack:  # pragma: no cover - adapters
        raise NotImplementedError

    def _stash_grads(self) -> Callable[[], None]:  # pragma: no cover - adapters
        raise NotImplementedError
