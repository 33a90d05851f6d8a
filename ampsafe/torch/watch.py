"""PyTorch side of ``ampsafe.watch``: find the op, pass and sample of the first non-finite value.

Forward: a ``TorchFunctionMode`` sees every functional op, tensor method and operator at the autograd level
(after ``torch.autocast`` picked its dtype), checks each floating output with one ``isfinite().all()``, and
keeps the first op whose inputs were finite and whose outputs were not. Re-running that op in float32 with
autocast off says overflow or numerical error. Owners come from ``ampsafe.torch.modstack``.

Backward: a hook on the autograd node (``grad_fn``) of every op output: the first node that turned finite
incoming gradients into non-finite ones (for its inputs or its weights) is the origin, named by the forward op
that created it. Node hooks live on this step's graph, not on the model, and in-place ops are harmless to
them (module backward hooks are not).

Guard mode installs only a root pre-hook (RNG and buffer snapshot); ``check()`` fuses the loss and every
gradient norm into one host sync and replays the step with full hooks on a hit.
"""

from __future__ import annotations

import inspect
import logging
from contextlib import ExitStack

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..core import sentinel as core
from ..core.sentinel import MOVEMENT_OPS, WatchBase
from ..errors import NonFiniteError
from .modstack import current_module, module_stack

__all__ = ["Watch", "op_name"]

log = logging.getLogger("ampsafe.watch")

_LOW = (torch.float16, torch.bfloat16)
_DUNDER = {
    "add": "add",
    "radd": "add",
    "iadd": "add",
    "sub": "sub",
    "rsub": "sub",
    "isub": "sub",
    "mul": "mul",
    "rmul": "mul",
    "imul": "mul",
    "truediv": "div",
    "rtruediv": "div",
    "itruediv": "div",
    "div": "div",
    "rdiv": "div",
    "floordiv": "floor_divide",
    "matmul": "matmul",
    "rmatmul": "matmul",
    "pow": "pow",
    "rpow": "pow",
    "ipow": "pow",
    "neg": "neg",
    "abs": "abs",
    "getitem": "getitem",
    "setitem": "setitem",
}
_RENAME = {"cat": "concat", "true_divide": "div", "divide": "div", "multiply": "mul", "subtract": "sub"}
_SKIP = frozenset({"__get__", "__set__", "__repr__", "__format__", "__len__", "__iter__", "__bool__", "__hash__"})


def op_name(func) -> tuple[str | None, bool]:
    """(canonical op name, in-place?) of a torch function as a TorchFunctionMode sees it; None for accessors."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name in _SKIP:
        return None, False
    if name.startswith("__") and name.endswith("__"):
        bare = name[2:-2]
        inplace = bare.startswith("i") and bare[1:] in _DUNDER or bare == "setitem"
        return _DUNDER.get(bare, bare), inplace
    inplace = name.endswith("_") and not name.startswith("_")
    base = name[:-1] if inplace else name
    return _RENAME.get(base, base), inplace


def _float_tensors(obj, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        ok = obj.is_floating_point() and obj.device.type != "meta" and not obj.is_sparse
        return [obj] if ok else []
    if depth < 3 and isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _float_tensors(item, depth + 1)]
    if depth < 3 and isinstance(obj, dict):
        return [t for item in obj.values() for t in _float_tensors(item, depth + 1)]
    return []


def _finite(t: torch.Tensor) -> bool:
    return t.numel() == 0 or bool(torch.isfinite(t).all())


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


def _upcast(obj, depth: int = 0):
    """float32 copies of every low-precision (or any floating) tensor, float32 for low-precision dtypes."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float32, copy=True) if obj.is_floating_point() else obj
    if isinstance(obj, torch.dtype):
        return torch.float32 if obj in _LOW else obj
    if depth < 3 and isinstance(obj, (list, tuple)):
        return type(obj)(_upcast(x, depth + 1) for x in obj)
    if depth < 3 and isinstance(obj, dict):
        return {k: _upcast(v, depth + 1) for k, v in obj.items()}
    return obj


class _Pass:
    """One forward pass (and the backward of its graph): what was found, and what it needs to find more."""

    def __init__(self, step: int):
        self.step = step
        self.batch_size: int | None = None
        self.bad_inputs: list[tuple[str, int | None, int]] = []  # (where, sample, storage ptr)
        self.pending: tuple | None = None  # a data-movement op that passed a bad input along
        self.forward_event: NonFiniteError | None = None
        self.backward_event: NonFiniteError | None = None
        self.nodes: dict[int, object] = {}  # id(grad_fn) -> grad_fn (kept alive so ids stay unique)

    @property
    def done(self) -> bool:
        return self.forward_event is not None or self.backward_event is not None


class _ForwardMode(TorchFunctionMode):
    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = self.watch
        name, inplace = op_name(func)
        if name == "backward":
            try:
                return func(*args, **kwargs)
            finally:
                w._phase = "idle"
        p = w._pass
        if name is None or w._suspended or w._phase == "idle" or p is None or p.done:
            return func(*args, **kwargs)
        pre = None
        if inplace and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            first = args[0]
            pre = (_finite(first), first.detach().clone() if first.dtype in _LOW else None)
        out = func(*args, **kwargs)
        floats = _float_tensors(args[0] if name == "setitem" else out)
        if not floats:
            return out
        if not all(_finite(t) for t in floats):
            w._forward_origin(func, name, args, kwargs, floats, pre)
        elif w.backward and torch.is_grad_enabled():
            w._hook_nodes(name, floats)
        return out


class Watch(WatchBase):
    """``ampsafe.watch`` for a ``torch.nn.Module`` (build it with :func:`ampsafe.watch`)."""

    def __init__(self, model, **options):
        super().__init__(model, **options)
        self._stack = ExitStack()
        self._full: ExitStack | None = None
        self._handles: list = []
        self._pass: _Pass | None = None
        self._phase = "idle"
        self._depth = 0
        self._suspended = 0
        self._replaying = False
        self._forward_count = 0
        self._snapshot: dict | None = None
        self._paths: list[tuple[str, tuple]] | None = None
        self._monitor_handles: list = []
        self._monitor_amax: dict[str, torch.Tensor] = {}
        self._monitor_step: int | None = None
        self._active = False
        self._param_ptrs: dict[int, str] = {}
        try:
            self._signature = inspect.signature(model.forward)
        except (TypeError, ValueError):
            self._signature = None

    # ------------------------------------------------------------------------------------------ context
    def __enter__(self) -> Watch:
        self._handles = [
            self.model.register_forward_pre_hook(self._root_pre, with_kwargs=True),
            self.model.register_forward_hook(self._root_post, always_call=True),
        ]
        self._active = True
        if not self.guard:
            self._install_full()
        return self

    def __exit__(self, *exc) -> bool:
        self._active = False
        try:
            self._remove_full()
            self._monitor_detach()
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            self._pass = None  # drop the last step's graph (its autograd nodes / hooked tensors)
        return False

    def _install_full(self) -> None:
        if self._full is not None:
            return
        self._param_ptrs = {_storage(t): n for n, t in [*self.model.named_parameters(), *self.model.named_buffers()]}
        stack = ExitStack()
        stack.enter_context(module_stack(self.model))
        stack.enter_context(_ForwardMode(self))
        self._full = stack

    def _remove_full(self) -> None:
        if self._full is not None:
            full, self._full = self._full, None
            full.close()
        self._phase = "idle"

    # ------------------------------------------------------------------------------------------ root hooks
    def _root_pre(self, module, args, kwargs):
        if self._suspended:
            return None
        self._depth += 1
        if self._depth > 1:
            return None
        step = self._forward_count - 1 if self._replaying else self._forward_count
        if not self._replaying:
            self._forward_count += 1
            if self.guard and self._snapshot is None:
                self._snapshot = self._take_snapshot()
            if self.monitored(step):
                self._monitor_begin(args, kwargs, step)
        if self._full is not None:
            self._pass = _Pass(step)
            self._phase = "forward"
            self._suspended += 1
            try:
                self._scan_inputs(args, kwargs)
            finally:
                self._suspended -= 1
        return None

    def _root_post(self, module, args, output):
        if self._suspended:
            return None
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return None
        self._suspended += 1
        try:
            self._monitor_end()
        finally:
            self._suspended -= 1
        p = self._pass
        if self._full is not None and p is not None:
            self._phase = "loss"
            if p.bad_inputs and not p.done:  # the bad data never reached a floating op: blame the input
                where, sample, _ = p.bad_inputs[0]
                err = core.nonfinite_error(
                    phase="forward", module="", op="input", kind=core.INPUT, sample=sample, where=where, step=p.step
                )
                p.forward_event = err
                self.report(err)
        return None

    def _scan_inputs(self, args, kwargs) -> None:
        named: list[tuple[str, object]]
        try:
            bound = self._signature.bind(*args, **kwargs) if self._signature else None
            named = list(bound.arguments.items()) if bound else []
        except TypeError:
            bound = None
        if not bound:
            named = [(f"args[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
        for name, value in named:
            self._scan_value(name, value, None, 0)

    def _scan_value(self, where: str, value, sample, depth: int) -> None:
        p = self._pass
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                return
            if p.batch_size is None and value.ndim and depth == 0:
                p.batch_size = int(value.shape[0])
            if not _finite(value):
                row = core.first_nonfinite_row(_np(value), int(value.shape[0]) if value.ndim else None)
                if sample is None:
                    sample = row
                    where += f"[{row}]" if row is not None else ""
                elif row is not None:
                    where += f" row {row}"
                p.bad_inputs.append((where, sample, _storage(value)))
        elif isinstance(value, (list, tuple)) and depth < 3:
            if (
                depth == 0
                and p.batch_size is None
                and value
                and all(isinstance(v, (torch.Tensor, dict)) for v in value)
            ):
                p.batch_size = len(value)
            for i, v in enumerate(value):
                self._scan_value(f"{where}[{i}]", v, i if sample is None and depth == 0 else sample, depth + 1)
        elif isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                # a dict of batched arrays (ppdet's inputs): its values are batched like top-level tensors
                self._scan_value(f"{where}[{k!r}]", v, sample, depth + 1 if depth else 0)

    # ------------------------------------------------------------------------------------------ forward origin
    def _forward_origin(self, func, name: str, args, kwargs, outputs: list, pre) -> None:
        p = self._pass
        module = current_module() if self._depth > 0 else "<loss>"
        inputs = _float_tensors(args) + _float_tensors(kwargs)
        input_ok = [_finite(t) for t in inputs]
        if pre is not None and inputs:
            input_ok[0] = pre[0]
        inputs_finite = all(input_ok)
        if not inputs_finite and name in MOVEMENT_OPS and p.bad_inputs:
            if p.pending is None:
                p.pending = (module, name)
            return  # a view or copy of bad data: the first op computing with it is reported
        low = any(t.dtype in _LOW for t in inputs + outputs)
        rerun_finite = self._rerun(func, args, kwargs, pre) if inputs_finite and low else None
        bad_in = [t for t, ok in zip(inputs, input_ok) if not ok]
        from_param = any(_storage(t) in self._param_ptrs for t in bad_in)
        kind = core.verdict(low, inputs_finite, rerun_finite, from_param=from_param)
        where, sample = "", None
        if kind == core.INPUT:
            ptrs = {_storage(t) for t in bad_in}
            match = [b for b in p.bad_inputs if b[2] in ptrs] or p.bad_inputs
            if match:
                where, sample, _ = match[0]
        elif kind == core.PARAMETER:
            where = ", ".join(
                sorted({self._param_ptrs[_storage(t)] for t in bad_in if _storage(t) in self._param_ptrs})
            )
        if sample is None and kind != core.PARAMETER:
            bad_out = next(t for t in outputs if not _finite(t))
            sample = core.first_nonfinite_row(_np(bad_out), p.batch_size)
        stats = {
            "inputs": [core.tensor_stats(_np(t)) for t in inputs[:4]],
            "outputs": [core.tensor_stats(_np(t)) for t in outputs[:4]],
            "rerun_float32_finite": rerun_finite,
        }
        dtype = str(outputs[0].dtype).replace("torch.", "")
        err = core.nonfinite_error(
            phase="forward",
            module=module,
            op=name,
            kind=kind,
            sample=sample,
            stats=stats,
            dtype=dtype,
            where=where,
            step=p.step,
        )
        p.forward_event = err
        self.report(err)

    def _rerun(self, func, args, kwargs, pre) -> bool | None:
        """Whether ``func`` gives finite outputs in float32 on the same (upcast) inputs, autocast off."""
        if op_name(func)[0] in ("half", "bfloat16"):  # a cast *to* low precision: float32 keeps finite values
            return True
        if pre is not None and pre[1] is not None:
            args = (pre[1], *args[1:])
        up_args, up_kwargs = _upcast(tuple(args)), _upcast(dict(kwargs))
        try:
            with ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                for device in ("cpu", "cuda"):
                    if device == "cpu" or torch.cuda.is_available():
                        stack.enter_context(torch.autocast(device_type=device, enabled=False))
                self._suspended += 1
                try:
                    out = func(*up_args, **up_kwargs)
                finally:
                    self._suspended -= 1
        except Exception as exc:  # noqa: BLE001 - an op that refuses float32 inputs: no verdict from the rerun
            log.debug("float32 re-run of %s failed: %s", func, exc)
            return None
        floats = _float_tensors(up_args[0] if out is None and up_args else out)
        return all(_finite(t) for t in floats)

    # ------------------------------------------------------------------------------------------ backward
    def _hook_nodes(self, name: str, floats: list) -> None:
        p = self._pass
        module = current_module() if self._depth > 0 else "<loss>"
        for t in floats:
            node = t.grad_fn
            if node is None or id(node) in p.nodes:
                continue
            p.nodes[id(node)] = node
            node.register_hook(self._node_hook(p, module, name))

    def _node_hook(self, p: _Pass, module: str, name: str):
        def hook(grad_inputs, grad_outputs):
            if not self._active or p.done or self._suspended:
                return None
            self._suspended += 1
            try:
                check(grad_inputs, grad_outputs)
            finally:
                self._suspended -= 1
            return None

        def check(grad_inputs, grad_outputs):
            gin = [g for g in grad_inputs if isinstance(g, torch.Tensor) and g.is_floating_point()]
            bad = [g for g in gin if not _finite(g)]
            if not bad:
                return None
            gout = [g for g in grad_outputs if isinstance(g, torch.Tensor) and g.is_floating_point()]
            arrived_finite = all(_finite(g) for g in gout)
            low = any(g.dtype in _LOW for g in gin + gout)
            has_inf = bool(torch.isinf(bad[0]).any())
            kind = core.OVERFLOW if low and has_inf and arrived_finite else core.NUMERICAL
            stats = {
                "grad_outputs": [core.tensor_stats(_np(g)) for g in gout[:4]],
                "grad_inputs": [core.tensor_stats(_np(g)) for g in gin[:4]],
                "arrived_finite": arrived_finite,
                "inputs": [core.tensor_stats(_np(g)) for g in gout[:4]],
                "outputs": [core.tensor_stats(_np(g)) for g in gin[:4]],
            }
            err = core.nonfinite_error(
                phase="backward",
                module=module,
                op=name,
                kind=kind,
                sample=core.first_nonfinite_row(_np(bad[0]), p.batch_size),
                stats=stats,
                dtype=str(bad[0].dtype).replace("torch.", ""),
                where="gradient of its inputs/weights" + ("" if arrived_finite else ", arrived non-finite"),
                step=p.step,
            )
            p.backward_event = err
            self.report(err)

        return hook

    # ------------------------------------------------------------------------------------------ guard
    def _take_snapshot(self) -> dict:
        buffers = [b for b in self.model.buffers()]
        snap = {"rng": torch.get_rng_state(), "buffers": buffers, "copies": [b.clone() for b in buffers]}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            snap["cuda_rng"] = torch.cuda.get_rng_state_all()
        return snap

    def _restore_snapshot(self, snap: dict) -> None:
        torch.set_rng_state(snap["rng"])
        if "cuda_rng" in snap:
            torch.cuda.set_rng_state_all(snap["cuda_rng"])
        with torch.no_grad():
            if snap["buffers"]:
                torch._foreach_copy_(snap["buffers"], snap["copies"])

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
        values = []
        if loss is not None:
            values += [v.detach().reshape(-1).float() for v in _float_tensors(loss)]
        grad_list = [p.grad for p in self.model.parameters() if p.grad is not None] if grads else []
        if grad_list:
            by_dtype: dict = {}
            for g in grad_list:
                by_dtype.setdefault((g.dtype, g.device), []).append(g)
            for group in by_dtype.values():
                values.append(torch.stack(torch._foreach_norm(group)).float())
        if not values:
            return True
        if bool(torch.isfinite(torch.cat(values)).all()):
            return True
        loss_bad = loss is not None and not all(_finite(v) for v in _float_tensors(loss))
        before = len(self.events)
        if replay is not None and snap is not None:
            self._replay(replay, snap, run_backward=not loss_bad)
        if len(self.events) == before:
            phase = "forward" if loss_bad else "backward"
            what = "the loss" if loss_bad else "a gradient norm"
            err = core.nonfinite_error(
                phase=phase,
                module="<loss>" if loss_bad else "",
                op="loss" if loss_bad else "grad_norm",
                kind=core.UNKNOWN,
                where=f"guard: {what} is non-finite"
                + ("; the replay did not reproduce it" if replay is not None else ""),
                step=self.step_count - 1,
            )
            self.report(err)
        return False

    def _replay(self, replay, snap: dict, *, run_backward: bool) -> None:
        params = [p for p in self.model.parameters()]
        saved_grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        self._restore_snapshot(snap)
        self._replaying = True
        self._install_full()
        try:
            loss = replay()
            if run_backward and self.backward and isinstance(loss, torch.Tensor) and loss.requires_grad:
                if not (self._pass and self._pass.done):
                    loss.backward()
        finally:
            self._remove_full()
            self._replaying = False
            for p, g in zip(params, saved_grads):
                p.grad = g
            self._restore_snapshot({"rng": torch.get_rng_state(), **{k: v for k, v in snap.items() if k != "rng"}})

    # ------------------------------------------------------------------------------------------ monitor
    def _find_paths(self, args, kwargs) -> list[tuple[str, tuple]]:
        """Unnormalized paths (start, layers) from ``ampsafe.scan`` on this step's inputs (state restored)."""
        snap = self._take_snapshot()
        self._suspended += 1
        try:
            from ..scanner import scan

            example = dict(kwargs) if kwargs and not args else tuple(args)
            if kwargs and args and self._signature is not None:
                example = dict(self._signature.bind(*args, **kwargs).arguments)
            report = scan(self.model, example, margin_bits=self.margin_bits)
            paths = [(p.start, tuple(p.layers)) for p in report.paths if not p.normalized]
        except Exception as exc:  # noqa: BLE001 - no scan: watch every conv/linear output instead
            log.warning("ampsafe.watch: scan unavailable (%s); monitoring every conv/linear output", exc)
            kinds = (torch.nn.modules.conv._ConvNd, torch.nn.Linear)
            paths = [(n, (n,)) for n, m in self.model.named_modules() if isinstance(m, kinds)]
        finally:
            self._suspended -= 1
            self._restore_snapshot(snap)
        return paths

    def _monitor_begin(self, args, kwargs, step: int) -> None:
        if self._paths is None:
            self._paths = self._find_paths(args, kwargs)
        modules = dict(self.model.named_modules())
        wanted = {layer for _, layers in self._paths for layer in layers if layer in modules}
        self._monitor_amax = {}
        self._monitor_step = step
        for name in wanted:
            self._monitor_handles.append(modules[name].register_forward_hook(self._amax_hook(name)))

    def _amax_hook(self, name: str):
        def hook(module, args, output):
            floats = _float_tensors(output)
            if not floats or self._suspended:
                return
            self._suspended += 1
            try:
                with torch.no_grad():
                    amax = torch.stack([t.detach().abs().amax().float() for t in floats]).amax()
                    prev = self._monitor_amax.get(name)
                    self._monitor_amax[name] = amax if prev is None else torch.maximum(prev, amax)
            finally:
                self._suspended -= 1

        return hook

    def _monitor_detach(self) -> None:
        for h in self._monitor_handles:
            h.remove()
        self._monitor_handles = []

    def _monitor_end(self) -> None:
        if self._monitor_step is None:
            return
        step, self._monitor_step = self._monitor_step, None
        self._monitor_detach()
        if not self._monitor_amax:
            return
        names = list(self._monitor_amax)
        values = torch.stack([self._monitor_amax[n] for n in names]).tolist()  # one host sync
        amax = dict(zip(names, values))
        path_amax = {}
        for start, layers in self._paths or []:
            seen = [amax[x] for x in layers if x in amax]
            if seen:
                path_amax[start] = (layers, max(seen))
        self.last_headroom = {s: v[1] for s, v in path_amax.items()}
        self.emit_headroom(path_amax, step)
