"""PaddlePaddle side of ``ampsafe.watch``: the op, pass and sample of the first non-finite value.

Forward: an :class:`~ampsafe.paddle.intercept.OpMode` checks every intercepted op's floating outputs. It must
see an op *after* ``emulate_fp16`` rounded its output through float16 (that rounding is where the inf is
born), so at each forward the watcher makes sure it is the innermost mode, pushing itself again if an emulator
was entered inside it. "Ran in low precision" means: a float16/bfloat16 dtype, or an output the emulator
marks as float16; the float32 re-run happens inside ``fp32_region()``, which the emulator leaves alone.

An op's non-finite output is an origin, reported only when a value it made reaches what always counts (the
model's output, a scalar loss, a backward, a parameter written in place): SVTR's Local mixers add a ``-inf``
buffer to their logits and the softmax gives those lanes back as zeros; such lanes are no event. A non-finite
gradient in a pass that had a forward origin names that origin (an ``exp`` that overflowed to inf behind a
``reciprocal`` leaves the forward finite and its gradient, 0 * inf, NaN).

Backward: tensor hooks on every op output and parameter; the first gradient that arrives non-finite names the
op(s) that consumed that tensor in the forward (their backward produced it). Hooks die with the step's graph;
parameter hooks are removed when the block exits.
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

import paddle

from ..core import sentinel as core
from ..core.sentinel import MOVEMENT_OPS
from ..core.watcher import WatchBase, WatchPass, map_nested
from ..errors import NonFiniteError
from . import intercept
from .emulate import Fp16Emulator
from .tensors import LOW_DTYPES, TENSORS

__all__ = ["Watch"]

log = logging.getLogger("ampsafe.watch")

_tensors = TENSORS
_finite = _tensors.finite
_is_float = _tensors.is_float
_float_tensors = _tensors.checkable_leaves
_np = _tensors.to_numpy


# ops whose trailing outputs are backward caches a forward need not fill: batch_norm returns (out, mean_out,
# variance_out, saved_mean, saved_variance, reserve_space), and in eval mode the last three are uninitialized memory
_VALUE_OUTPUTS = {"batch_norm": 3, "sync_batch_norm": 3}
# outputs that share memory with a parameter the op updates in place (the running mean and variance; Paddle does not
# bump the parameters' inplace_version for that write)
_RUNNING_STATS = {"batch_norm": slice(1, 3), "sync_batch_norm": slice(1, 3)}


def _value_outputs(op: str, out):
    """The outputs of ``op`` that hold values the forward computed."""
    count = _VALUE_OUTPUTS.get(op)
    if count is not None and isinstance(out, (list, tuple)):
        return out[:count]
    return out


def _upcast(obj):
    return map_nested(
        obj, lambda x: x.detach().astype("float32") if isinstance(x, paddle.Tensor) and _is_float(x) else x
    )


def _emulators() -> list:
    return [m for m in intercept.active_modes() if isinstance(m, Fp16Emulator)]


class _Restore:
    """Undo the root forward wrapper (restore an instance-level forward the model had of its own)."""

    def __init__(self, model, own_forward):
        self.model, self.own_forward = model, own_forward

    def remove(self) -> None:
        if self.own_forward is not None:
            self.model.forward = self.own_forward
        else:
            vars(self.model).pop("forward", None)


def _ran_low(outputs: list) -> bool:
    """An op's outputs are float16/bfloat16, or float16 values an emulator rounded (emulated AMP on a CPU)."""
    return any(t.dtype in LOW_DTYPES for t in outputs) or any(e.is_fp16(t) for e in _emulators() for t in outputs)


class _Pass(WatchPass):
    def __init__(self, step: int):
        super().__init__(step)
        self.hooked: dict[int, object] = {}  # id -> tensor (kept alive so ids stay unique)
        self.consumers: dict[int, list[tuple[str, str]]] = {}  # tensor id -> [(module, op)] that read it
        # tensor ids read by an op that ran in float16 (real, or rounded by an emulator): their gradients come
        # back through that op's float16 backward, so an inf there is a float16 overflow, not a float32 error
        self.low_reads: set[int] = set()
        self.handles: list = []  # the gradient hooks on this pass's tensors (removed when the watch exits)

    def remove_hooks(self) -> None:
        """Paddle holds a tensor's gradient hooks from C++, where the collector cannot see them: a hook left on a
        tensor that a raised error's traceback keeps alive would keep the watch (and its model) alive."""
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()


class _Mode(intercept.OpMode):
    def __init__(self, watch: Watch):
        self.watch = watch
        self.local = threading.local()

    def __call__(self, op, func, args, kwargs):
        w = self.watch
        p = w._pass
        if getattr(self.local, "busy", False) or w._suspended or w._phase == "idle" or p is None or p.done:
            return func(*args, **kwargs)
        self.local.busy = True  # a second copy of this mode further down the stack passes the op through
        try:
            inputs = _float_tensors(args) + _float_tensors(kwargs)
            module = intercept.current_module() if w._depth > 0 else "<loss>"
            if w.backward:
                for t in inputs:
                    if id(t) in p.hooked or id(t) in w._param_keys:
                        p.consumers.setdefault(id(t), []).append((module, op))
            out = func(*args, **kwargs)
            floats = _float_tensors(_value_outputs(op, out))
            if w.backward and floats and _ran_low(floats):
                p.low_reads.update(id(t) for t in inputs if id(t) in p.hooked or id(t) in w._param_keys)
            if floats and not all(_finite(t) for t in floats):
                written = floats[_RUNNING_STATS[op]] if op in _RUNNING_STATS else []
                w._forward_origin(op, func, args, kwargs, inputs, floats, module, written=written)
            elif floats and w.backward:
                w._hook_outputs(op, module, floats)
            return out
        finally:
            self.local.busy = False


class Watch(WatchBase):
    """``ampsafe.watch`` for a ``paddle.nn.Layer`` (build it with :func:`ampsafe.watch`)."""

    defers_origin = True
    _input_label = "inputs"
    _grad_what = "a gradient"

    def __init__(self, model, **options):
        super().__init__(model, **options)
        self._extra: ExitStack = ExitStack()
        self._mode = _Mode(self)
        self._pending: NonFiniteError | None = None
        self._buffer_names: dict[int, str] = {}  # id -> name of the model's buffers that nothing trains

    # ------------------------------------------------------------------------------------------ context
    def _root_handles(self) -> list:
        # The root is wrapped at its forward, not hooked: Paddle iterates a layer's hook dicts while calling
        # them, and the monitor's one-time scan (run from here) registers hooks on the root.
        model, had_own = self.model, "forward" in vars(self.model)
        original = model.forward

        def forward(*inputs, **kwargs):
            self._root_pre(inputs, {})
            output = None
            try:
                output = original(*inputs, **kwargs)
                return output
            finally:
                self._root_post(output)

        model.forward = forward
        return [_Restore(model, original if had_own else None)]

    def _training_forward(self) -> bool:
        return self.model.training and paddle.is_grad_enabled()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._pass is not None:
            self._pass.remove_hooks()
        super().__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._raise_pending()
        return False

    def _full_hooks(self) -> ExitStack:
        trainable = {id(t) for t in self.model.parameters() if not t.stop_gradient}
        self._buffer_names = {id(t): n for n, t in self.model.named_buffers() if id(t) not in trainable}
        stack = ExitStack()
        stack.enter_context(intercept.module_stack(self.backend.modules(self.model)))
        stack.enter_context(intercept.op_mode(self._mode))
        if self.backward:
            original = paddle.Tensor.backward
            paddle.Tensor.backward = self._backward_wrapper(original)
            stack.callback(setattr, paddle.Tensor, "backward", original)
            for name, param in self.model.named_parameters():
                if not param.stop_gradient:
                    handle = param.register_hook(self._param_hook(name, id(param)))
                    stack.callback(handle.remove)
        return stack

    def _remove_full(self) -> None:
        self._extra.close()
        super()._remove_full()

    def report(self, error: NonFiniteError) -> None:
        if self.on_nonfinite == "raise":  # the forward unwinds: its post hooks will not all run
            self._phase = "idle"
        super().report(error)

    # ------------------------------------------------------------------------------------------ root forward
    def _root_pre(self, args, kwargs) -> None:
        if not self._suspended:
            self._raise_pending()
        super()._root_pre(args, kwargs)

    def _new_pass(self, step: int) -> _Pass:
        modes = intercept.active_modes()
        if modes and modes[-1] is not self._mode:  # an emulator was entered inside: see ops after it
            self._extra.enter_context(intercept.op_mode(self._mode))
        return _Pass(step)

    def _pass_open(self) -> bool:
        return self._phase == "forward"  # a raise already closed it (see report)

    # ------------------------------------------------------------------------------------------ forward origin
    def _forward_origin(
        self, op: str, func, args, kwargs, inputs: list, outputs: list, module: str, *, written: list = ()
    ) -> None:
        """``written``: outputs that are parameters the op wrote in place (BatchNorm's running statistics)."""
        p = self._pass
        input_ok = [_finite(t) for t in inputs]
        inputs_finite = all(input_ok)
        if not inputs_finite and (self.carry(inputs, outputs) or self._mask_buffers(op, module, inputs, outputs)):
            self._reached(outputs, written)
            return
        if not inputs_finite and op in MOVEMENT_OPS and p.bad_inputs:
            return  # a view or copy of bad data: the first op computing with it is reported
        emulators = _emulators()
        low = any(t.dtype in LOW_DTYPES for t in inputs + outputs) or any(
            e.is_fp16(t) for e in emulators for t in outputs
        )
        rerun = self._rerun(func, args, kwargs) if inputs_finite and low else (None, "")
        dtype = "float16 (emulated)" if low and emulators else _tensors.describe(outputs[0])[1]
        self._report_origin(module, op, inputs, input_ok, outputs, low=low, rerun=rerun, dtype=dtype)
        self._reached(outputs, written)

    def _mask_buffers(self, op: str, module: str, inputs: list, outputs: list) -> bool:
        """Non-finite buffers are masks when nothing trains them (SVTR's Local mixer adds a ``-inf`` buffer to its
        logits before the softmax): their lanes are carried like an op's, and reported only if they reach what
        always counts. A trainable parameter that is non-finite is an event at once."""
        bad = [t for t in inputs if not _finite(t)]
        names = [self._buffer_names.get(id(t)) for t in bad]
        if not bad or not all(names):
            return False
        p = self._pass
        err = core.nonfinite_error(
            phase="forward",
            module=module,
            op=op,
            kind=core.PARAMETER,
            where=", ".join(sorted(set(names))),
            stats={"inputs": [core.tensor_stats(_np(t)) for t in bad[:4]]},
            step=p.step,
        )
        p.candidates.append(err)
        for t in bad:
            p.carried[id(t)] = err
        return self.carry(inputs, outputs)

    def _reached(self, outputs: list, written: list) -> None:
        """Report now when the non-finite values went into a parameter or buffer (in place: BatchNorm's running
        mean), or into a scalar computed after the root forward (the loss): both always count."""
        into_param = any(not _finite(t) for t in written)
        if into_param or (self._phase == "loss" and any(t.size == 1 for t in outputs)):
            self.reaches(outputs)

    def _origin_where(self, kind: str, bad_in: list) -> tuple[str, int | None]:
        """The first bad model input (ids of transient Paddle tensors are no reliable match), or the
        non-finite parameters."""
        p, where, sample = self._pass, "", None
        if kind == core.INPUT and p.bad_inputs:
            where, sample, _ = p.bad_inputs[0]
        elif kind == core.PARAMETER:
            where = ", ".join(sorted(self._param_keys[id(t)] for t in bad_in if id(t) in self._param_keys))
        return where, sample

    def _rerun(self, func, args, kwargs) -> tuple[bool | None, str]:
        """(finite outputs when ``func`` re-runs in float32, an FP32 region with no emulator rounding?; why the
        re-run could not run, or "")."""
        try:
            with self.backend.amp.float32():
                self._suspended += 1
                try:
                    out = func(*_upcast(tuple(args)), **_upcast(dict(kwargs)))
                finally:
                    self._suspended -= 1
        except Exception as exc:  # noqa: BLE001 - a rerun that fails: the verdict says "unknown"
            log.debug("float32 re-run failed: %s", exc)
            return None, core.rerun_failure(exc)
        return all(_finite(t) for t in _float_tensors(out)), ""

    # ------------------------------------------------------------------------------------------ backward
    def _hook_outputs(self, op: str, module: str, floats: list) -> None:
        p = self._pass
        for t in floats:
            if t.stop_gradient or id(t) in p.hooked:
                continue
            p.hooked[id(t)] = t
            p.handles.append(t.register_hook(self._grad_hook(p, id(t), module, op, t)))

    def _param_hook(self, name: str, tid: int):
        def hook(grad):
            p = self._pass
            if p is not None:
                self._on_grad(p, grad, producer=("<parameter>", name), tid=tid)
            return None

        return hook

    def _grad_hook(self, p: _Pass, tid: int, module: str, op: str, tensor):
        emulators = _emulators()
        low = tensor.dtype in LOW_DTYPES or any(e.is_fp16(tensor) for e in emulators)

        def hook(grad):
            self._on_grad(p, grad, producer=(module, op), tid=tid, low=low)
            return None

        return hook

    def _on_grad(self, p: _Pass, grad, *, producer, tid: int, low: bool = False) -> None:
        if not self._active or p.done or self._suspended or grad is None:
            return
        self._suspended += 1
        try:
            if _finite(grad):
                return
            if p.candidates:  # a forward value no later value carried went into this gradient (0 * inf): name it
                err = p.candidates[0]
                p.forward_event = err
                if self.on_nonfinite == "raise":
                    self._pending = err
                else:
                    self.report(err)
                return
            consumers = p.consumers.get(tid, [])
            module, op = consumers[-1] if consumers else producer
            has_inf = bool(paddle.isinf(grad).any())
            low = low or grad.dtype in LOW_DTYPES or tid in p.low_reads
            kind = core.OVERFLOW if low and has_inf else core.NUMERICAL
            read_by = ", ".join(f"{m or '<root>'}:{o}" for m, o in consumers) or "?"
            where = f"gradient of {producer[0] or '<root>'}:{producer[1]}'s output, read by {read_by}"
            err = core.nonfinite_error(
                phase="backward",
                module=module,
                op=op,
                kind=kind,
                sample=core.first_nonfinite_row(_np(grad), p.batch_size),
                stats={"outputs": [core.tensor_stats(_np(grad))], "producer": producer, "consumers": consumers},
                dtype=(  # the emulator's block has closed by the backward: a low float32 gradient was an emulated one
                    "float16 (emulated)" if low and grad.dtype not in LOW_DTYPES else _tensors.describe(grad)[1]
                ),
                where=where,
                step=p.step,
            )
            p.backward_event = err
            if self.on_nonfinite == "raise":  # Paddle turns an exception in a hook into an OSError: defer it
                self._pending = err
            else:
                self.report(err)
        finally:
            self._suspended -= 1

    def _raise_pending(self) -> None:
        err, self._pending = self._pending, None
        if err is not None:
            self.report(err)

    def _backward_wrapper(self, original):
        watch = self

        def backward(tensor, *args, **kwargs):
            if watch._pass is not None and watch._phase != "idle" and not watch._suspended:
                watch.reaches([tensor])  # a non-finite value the backward starts from always counts
            try:
                result = original(tensor, *args, **kwargs)
            except Exception:
                if watch._pending is not None:
                    watch._raise_pending()
                raise
            watch._phase = "idle"
            watch._raise_pending()
            return result

        backward._ampsafe_watch = True
        return backward

    # ------------------------------------------------------------------------------------------ guard
    def _stash_grads(self):
        """The step is skipped anyway: its non-finite gradients are dropped (before and after the replay)."""
        params = list(self.model.parameters())
        for p in params:
            p.clear_gradient(set_to_zero=False)

        def clear():
            for p in params:
                p.clear_gradient(set_to_zero=False)

        return clear
