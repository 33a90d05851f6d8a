"""``ampsafe.torch.GradScaler``: ``torch.amp.GradScaler`` with a floor, a cap, hysteresis, a failure that names
the offending parameters, an FP32 guard mode, and ``found_inf`` agreed across ranks.

Example::

    scaler = ampsafe.torch.GradScaler("cuda", min_scale=1.0, on_floor="raise")
    for batch in data:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                  # optional: clip unscaled gradients
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)                      # skipped when any gradient is inf/NaN (on any rank)
        scaler.update()                             # LossScaleFloorError when overflow persists at min_scale

The tensor work is torch's own (``_amp_foreach_non_finite_check_and_unscale_``, in :mod:`ampsafe.torch.grads`;
no per-parameter Python maths); the scale decisions come from :mod:`ampsafe.core.scale` on the host, fed by the
one ``found_inf.item()`` sync that ``step`` needs anyway, so a step costs no more host syncs than torch's scaler.
Optimizers that unscale and skip on the device (fused Adam) never hand found_inf to the host; off the CPU their
steps are decided on the device by a few tensor ops with the same rules and rounding
(:mod:`ampsafe.torch.device_scale`), reconciled with the host in one sync when needed. ``fp32_guard=True`` turns
scaling off and keeps the guard: steps whose gradients are non-finite are skipped and counted (for FP32 runs that
hit ``loss = nan``).

A pickle (``pickle``, ``copy.deepcopy``, ``torch.save(scaler)``) carries the scale state, not ``model=``, the
callbacks or the heal hook: re-attach those after loading (``state_dict()`` is the checkpoint format, as torch's).

It is a subclass of :class:`torch.amp.GradScaler` (as torch's ``ShardedGradScaler`` is), so libraries that
type-check their scaler accept it, and torch's private state keeps torch's meaning: ``_scale`` (the float32 scale
tensor, created at the first ``scale``), ``_growth_tracker`` / ``_init_growth_tracker``, ``_init_scale``,
``_growth_factor`` / ``_backoff_factor`` / ``_growth_interval`` and ``_per_optimizer_states`` (torch's
``{"stage", "found_inf_per_device"}`` per optimizer). The scale decisions stay on the host, so the growth tracker
is a view of the host's: reading ``_growth_tracker`` gives a fresh int32 tensor, assigning one sets it.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections import abc, defaultdict, deque
from typing import Any, Callable, Optional

import torch
from torch.amp import grad_scaler as _torch_grad_scaler

from ..core.scale import StepDecision, policy_for, policy_methods, policy_property
from ..healing.scaler import HealingScaler
from .backend import TorchBackend
from .device_scale import DeviceSteps
from .grads import nonfinite_params, unscale_and_check_

__all__ = ["GradScaler", "OptState", "device_scaler"]

OptState = _torch_grad_scaler.OptState  # torch's enum: per-optimizer states compare equal to torch's


def _fresh_state() -> dict[str, Any]:
    """torch's per-optimizer state (``_refresh_per_optimizer_state``): what torch's own methods and tests read."""
    return _torch_grad_scaler._refresh_per_optimizer_state()


def _fresh_info() -> dict[str, Any]:
    """ampsafe's per-optimizer extras beside torch's state: ``found_inf_host`` (the step's verdict once synced,
    None until then), ``reduced`` (found_inf all-reduced), ``offenders`` / ``optimizer`` (only at the floor)."""
    return {"found_inf_host": None, "reduced": False}


class GradScaler(HealingScaler, _torch_grad_scaler.GradScaler):
    """Drop-in for :class:`torch.amp.GradScaler` (same arguments, methods and per-optimizer protocol).

    Extra keyword-only arguments: ``min_scale`` / ``max_scale`` (floor and cap), ``hysteresis`` (consecutive
    overflowing steps before a backoff, Paddle's ``decr_every_n_nan_or_inf``), ``on_floor`` (``"raise"``,
    ``"clamp"``, ``"heal"``), ``process_group`` (ranks that agree on ``found_inf``; default: the default group
    when ``torch.distributed`` is initialized), ``fp32_guard`` (no scaling, skip non-finite steps),
    ``callback`` (``fn(StepDecision)`` after every update), ``model`` (names parameters in errors; found via the
    garbage collector when omitted), ``device_decisions`` (steps of self-unscaling optimizers such as fused Adam,
    whose found_inf never reaches the host, are decided on the device without a sync, as torch's are; the host
    syncs only when the unknown steps could have reached the floor (``on_floor`` raise/heal); default: when the
    scale lives on an accelerator). ``min_scale=0, max_scale=inf, hysteresis=1`` reproduce torch exactly.

    ``on_floor="heal"`` needs no ``ampsafe.heal`` call: at its first ``step`` the scaler resolves its model
    (``model=``, else the smallest module whose parameters cover the optimizer's) and keeps the inputs of its
    latest forward; at the floor it replays that batch under the sentinel, names the pass that overflowed, and
    heals (islands what overflows, restores the scale) or raises with what it measured. ``patience=N`` heals
    after N overflowing steps in a row when the replayed forward overflows, without waiting for the floor.
    ``disabled_reason``: why scaling is off (``"disabled (CUDA not available)"``, ...); None when it scales or guards.

    Pickling keeps the policy, scale, trackers and statistics and leaves ``model``, ``callback``, ``heal_hook``
    and instance-wrapped methods behind (they belong to the training loop); after ``pickle.loads`` re-attach
    them: ``scaler.add_step_callback(fn)``, ``ampsafe.heal(model, scaler=scaler)``.

    An ``init_scale`` outside ``[min_scale, max_scale]`` is clamped into it, with one warning that names the
    bound to widen; bounds that contradict each other raise :class:`~ampsafe.ConfigError`.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        hysteresis: int = 1,
        on_floor: str = "raise",
        process_group=None,
        fp32_guard: bool = False,
        callback: Optional[Callable[[StepDecision], Any]] = None,
        model: Optional[torch.nn.Module] = None,
        device_decisions: Optional[bool] = None,
        patience: Optional[int] = None,
    ) -> None:
        self._device = device
        self._enabled = bool(enabled) and not fp32_guard
        self.disabled_reason: Optional[str] = None
        if not enabled and not fp32_guard:  # the FP32 guard does not scale, but it is not disabled: it guards
            self.disabled_reason = "disabled by the script (enabled=False)"
        if self._enabled and device == "cuda" and not torch.cuda.is_available():
            warnings.warn("ampsafe GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
            self.disabled_reason = "disabled (CUDA not available)"
        self._guard = bool(fp32_guard)
        self._active = self._enabled or self._guard
        policy = policy_for(
            self._active,
            init_scale=1.0 if self._guard else init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            min_scale=min_scale,
            max_scale=max_scale,
            hysteresis=hysteresis,
            on_floor=on_floor,
            dynamic=not self._guard,
            product="float64",
        )
        self._init_scaler(policy, callback, model, patience)
        self._process_group = process_group
        self._scale: Optional[torch.Tensor] = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_fresh_state)
        self._step_info: dict[int, dict[str, Any]] = defaultdict(_fresh_info)
        self._losses: deque = deque(maxlen=16)
        self._device_decisions = device_decisions
        self._device_steps = DeviceSteps()  # steps of self-unscaling optimizers decided on the device
        self._core.pending = _reconciler(self)

    # -- torch's private state, with torch's meaning (views of the host state machine) ------------------------------
    @property
    def _init_scale(self) -> float:
        """torch: the value ``_scale`` is created with at the first ``scale()``; here the host's current scale."""
        return float(self._core.scale)

    @_init_scale.setter
    def _init_scale(self, value: float) -> None:
        self._reconcile()
        self._core.set_scale(value)
        if self._scale is not None:
            self._scale.fill_(float(self._core.scale))

    @property
    def _init_growth_tracker(self) -> int:
        """torch: the growth tracker ``_growth_tracker`` starts from (after a pickle or ``load_state_dict``)."""
        self._reconcile()
        return self._core.growth_tracker

    @_init_growth_tracker.setter
    def _init_growth_tracker(self, value: int) -> None:
        self._reconcile()
        self._core.growth_tracker = int(value)

    @property
    def _growth_tracker(self) -> Optional[torch.Tensor]:
        """torch: the int32 growth-tracker tensor beside ``_scale`` (None before the first ``scale()``). The host
        decides the steps, so this is a fresh tensor holding the host's tracker; assign one to set it."""
        if self._scale is None:
            return None
        self._reconcile()
        return torch.full((), self._core.growth_tracker, dtype=torch.int32, device=self._scale.device)

    @_growth_tracker.setter
    def _growth_tracker(self, value) -> None:
        if value is not None:
            self._reconcile()
            self._core.growth_tracker = int(value)

    _growth_factor = policy_property("growth_factor")
    _backoff_factor = policy_property("backoff_factor")
    _growth_interval = policy_property("growth_interval")

    # -- scale tensor ------------------------------------------------------------------------------------------------
    def _lazy_init_scale(self, device: torch.device) -> torch.Tensor:
        if self._scale is None:
            self._scale = torch.full((), float(self._core.scale), dtype=torch.float32, device=device)
        return self._scale

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        """torch's name: create ``_scale`` on ``dev`` (the growth tracker lives on the host)."""
        self._lazy_init_scale(dev)

    def _check_scale_growth_tracker(self, funcname: str) -> tuple:
        """torch's name: ``(_scale, _growth_tracker)``, or the AssertionError torch raises before any ``scale()``."""
        return self._check_scale(funcname), self._growth_tracker

    def _check_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise AssertionError(
                f"Attempted {funcname} but _scale is None.  This may indicate your script did not use "
                "scaler.scale(loss or outputs) earlier in the iteration."
            )
        return self._scale

    def scale(self, outputs):
        """Multiply a tensor (or nested list/tuple of tensors) by the scale; unchanged when scaling is off."""
        if not self._active:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._losses.append(outputs.detach())
            if self._guard:
                self._lazy_init_scale(outputs.device)
                return outputs
            scale = self._scale if self._scale is not None else self._lazy_init_scale(outputs.device)
            if scale.device != outputs.device:
                scale = scale.to(device=outputs.device, non_blocking=True)
            return outputs * scale
        per_device: dict[torch.device, torch.Tensor] = {}

        def apply(val):
            if isinstance(val, torch.Tensor):
                self._losses.append(val.detach())
                scale = self._lazy_init_scale(val.device)
                if self._guard:
                    return val
                if val.device not in per_device:
                    per_device[val.device] = scale.to(device=val.device, non_blocking=True)
                return val * per_device[val.device]
            if isinstance(val, abc.Iterable):
                mapped = map(apply, val)
                return type(val)(mapped) if isinstance(val, (list, tuple)) else mapped
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    # -- unscale / check ---------------------------------------------------------------------------------------------
    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool):
        """torch's private name for :func:`~ampsafe.torch.grads.unscale_and_check_` (wrappers call it)."""
        return unscale_and_check_(optimizer, inv_scale, found_inf, allow_fp16)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale (once per step), e.g. before gradient clipping."""
        if not self._active:
            return
        scale = self._ensure_scale_for(optimizer, "unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if self._guard:
            inv_scale = torch.ones((), dtype=torch.float32, device=scale.device)
        else:
            # as torch: the reciprocal in float64, so the unscaled gradients are bit-identical to torch's
            inv_scale = scale.double().reciprocal().float() if scale.device.type != "mps" else scale.reciprocal()
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, self._guard)
        state["stage"] = OptState.UNSCALED

    def _ensure_scale_for(self, optimizer, funcname: str) -> torch.Tensor:
        if self._scale is None and self._guard:  # the guard needs no scale() call: use the gradients' device
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        return self._lazy_init_scale(p.grad.device)
        return self._check_scale(funcname)

    def _check_inf_per_device(self, optimizer) -> dict:
        scale = self._ensure_scale_for(optimizer, "_check_inf_per_device")
        dummy = torch.ones((), dtype=torch.float32, device=scale.device)
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        found = self._unscale_grads_(optimizer, dummy, found_inf, True)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found
        return found

    def _found_inf_per_device(self, optimizer) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _combined_found_inf(self, state: dict, info: dict) -> torch.Tensor:
        """One found_inf tensor on the scale's device, all-reduced (MAX) over the process group."""
        values = list(state["found_inf_per_device"].values())
        device = self._scale.device
        combined = values[0] if values[0].device == device else values[0].to(device)
        for v in values[1:]:
            combined = combined + v.to(device)
        if not info["reduced"]:
            combined = self._all_reduce(combined)
            info["reduced"] = True
        state["found_inf_per_device"] = {device: combined}
        return combined

    def _all_reduce(self, found_inf: torch.Tensor) -> torch.Tensor:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self._process_group)
        return found_inf

    # -- step / update -----------------------------------------------------------------------------------------------
    def _maybe_opt_step(self, optimizer, state: dict, *args, **kwargs):
        info = self._step_info[id(optimizer)]
        found_inf = bool(self._reconcile(self._combined_found_inf(state, info)))  # the step's one host sync
        info["found_inf_host"] = found_inf
        if not found_inf:
            return optimizer.step(*args, **kwargs)
        if self._names_offenders():  # rare path: name the offenders while their gradients still exist
            info["offenders"] = nonfinite_params(optimizer)
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any):
        """Unscale (unless done), then ``optimizer.step()`` only if every gradient on every rank is finite."""
        if not self._active:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._resolve(optimizer)
        self._ensure_scale_for(optimizer, "step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False) and not self._guard:
            return self._step_self_unscaling(optimizer, state, *args, **kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def _step_self_unscaling(self, optimizer, state: dict, *args, **kwargs):
        """Optimizers that unscale and skip on device (fused Adam): hand them the scale and found_inf."""
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed optimizer.",
                FutureWarning,
                stacklevel=3,
            )
            kwargs["grad_scaler"] = self
            retval = optimizer.step(*args, **kwargs)
            state["stage"] = OptState.STEPPED
            return retval
        if state["stage"] is OptState.READY:
            self._check_inf_per_device(optimizer)
        info = self._step_info[id(optimizer)]
        found_inf = self._combined_found_inf(state, info)
        unscaled = state["stage"] is OptState.UNSCALED
        optimizer.grad_scale = (
            getattr(optimizer, "grad_scale", None) if unscaled else self._scale * getattr(optimizer, "grad_scale", 1)
        )
        optimizer.found_inf = found_inf
        try:
            retval = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale
            del optimizer.found_inf
        state["stage"] = OptState.STEPPED
        info["optimizer"] = optimizer
        return retval

    def update(self, new_scale: Optional[float | torch.Tensor] = None) -> None:
        """Advance the scale state machine (or set ``new_scale``); at the floor apply ``on_floor``."""
        if self._active:
            self._end_update(lambda: self._gather(new_scale))

    def _gather(self, new_scale) -> Optional[tuple]:
        """The step for :meth:`ScalerBase._end_update`: (found_inf, offenders, losses), or None when ``new_scale``
        is set or the step was decided on the device."""
        scale = self._check_scale("update")
        infos = self._step_info
        states = [(s, infos[key]) for key, s in self._per_optimizer_states.items()]
        self._per_optimizer_states = defaultdict(_fresh_state)
        self._step_info = defaultdict(_fresh_info)
        if new_scale is not None:
            self._losses.clear()
            self._reconcile()
            self._set_scale(new_scale, scale)
            return None
        checked = [(s, i) for s, i in states if s["found_inf_per_device"]]
        if not checked:
            raise AssertionError("No inf checks were recorded prior to update.")
        found_inf = False
        pending = []
        for s, i in checked:
            if i["found_inf_host"] is None:
                pending.append(self._combined_found_inf(s, i))
            else:
                found_inf = found_inf or i["found_inf_host"]
        if pending:  # optimizers that skipped on device, or unscale_ without step
            total = pending[0]
            for t in pending[1:]:
                total = total + t
            if len(pending) == len(checked) and self._decide_on_device() and self._device_steps.allowed(self._core):
                self._device_steps.step(self._core, scale, total)  # no host sync, like torch's _amp_update_scale_
                self._losses.clear()
                return None
            if bool(self._reconcile(total)):
                found_inf = True
                if self._names_offenders():
                    for _, i in checked:
                        if i["found_inf_host"] is None and "optimizer" in i:
                            i["offenders"] = nonfinite_params(i["optimizer"])
        losses = list(self._losses)
        self._losses.clear()
        return found_inf, [name for _, i in checked for name in i.get("offenders", ())], losses

    # -- device-side steps (self-unscaling optimizers: torch's needs no host sync there, so neither do we) --------
    @property
    def _lag(self) -> int:
        """Steps decided on the device only (self-unscaling optimizers), not yet known to the host."""
        return self._device_steps.lag

    def _decide_on_device(self) -> bool:
        """On a CPU a host read costs nothing and ~20 small tensor ops cost ~90 us, so only off the CPU by default."""
        if self._device_decisions is not None:
            return self._device_decisions
        return self._scale.device.type != "cpu"

    def _reconcile(self, extra: Optional[torch.Tensor] = None):
        """Bring device-decided steps into the host state with one sync, reading ``extra`` in the same sync."""
        return self._device_steps.reconcile(self._core, self._scale, extra)

    def _set_scale(self, new_scale, scale: torch.Tensor) -> None:
        if isinstance(new_scale, float):
            value = new_scale
        else:
            reason = (
                "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                "torch.FloatTensor with requires_grad=False."
            )
            if not isinstance(new_scale, torch.Tensor) or new_scale.device.type != scale.device.type:
                raise AssertionError(reason)
            if new_scale.numel() != 1 or new_scale.requires_grad:
                raise AssertionError(reason)
            value = float(new_scale.item())
        self._core.set_scale(value)
        scale.fill_(float(self._core.scale))

    # -- the framework of the floor's replay and heal (HealingScaler: its precision is ``backend.amp``) -----------
    def _backend(self):
        from .backend import BACKEND

        return BACKEND

    def fix_lines(self, paths) -> dict[str, tuple[str, str]]:
        """The report's lines of the engine that shards :attr:`model` for the healed ``paths``: key -> (line,
        advice); FSDP2 with a float16 ``param_dtype`` gives its ``fully_shard`` lines (``Backend.sharding.fix``)."""
        model = self.model
        return self._backend().sharding.fix(model, list(paths)) if model is not None else {}

    # -- the tensor side of ScalerBase's floor handling -------------------------------------------------------------
    # the Backend's wrappers, and FSDP1's, which ``unwrap`` leaves alone (its inner model holds flat parameters)
    _wrappers = frozenset({*TorchBackend.wrappers["module"], "FullyShardedDataParallel"})

    def _refresh_scale(self) -> None:
        self._scale.fill_(float(self._core.scale))

    # -- torch's getters / setters / persistence -------------------------------------------------------------------
    def _get_scale_async(self) -> Optional[torch.Tensor]:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when scaling is off). No device sync: the host knows it."""
        self._reconcile()
        return float(self._core.scale) if self._enabled else 1.0

    get_growth_factor, set_growth_factor = policy_methods("growth_factor")
    get_backoff_factor, set_backoff_factor = policy_methods("backoff_factor")
    get_growth_interval, set_growth_interval = policy_methods("growth_interval")

    def _get_growth_tracker(self) -> int:
        self._reconcile()
        return self._core.growth_tracker if self._enabled else 0

    def is_enabled(self) -> bool:
        """Whether loss scaling is on (False in FP32 guard mode, whose guard still skips non-finite steps)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """torch's five keys (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``) plus ``min_scale``, ``max_scale``, ``hysteresis``, ``on_floor``,
        ``_overflow_tracker``, ``_last_clean_scale`` and ``stats``. Empty when inactive, as torch's."""
        self._reconcile()
        return self._core.state_dict() if self._active else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from this class or from ``torch.amp.GradScaler`` (then the extras stay as built)."""
        if not self._active:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        self._device_steps.discard()
        self._core.load_state_dict(state_dict)
        if self._scale is not None:
            self._scale.fill_(float(self._core.scale))

    def __getstate__(self) -> dict[str, Any]:
        """The scale, policy, trackers and statistics; not the model, callbacks or hooks (see
        :meth:`ScalerBase.__getstate__`: re-attach them after loading). Only between iterations, as torch's."""
        if self._active and any(s["found_inf_per_device"] for s in self._per_optimizer_states.values()):
            raise AssertionError(self.MID_ITERATION)
        self._reconcile()
        state = super().__getstate__()
        state["_scale"] = None  # created again, on the device of the next scale() call
        state["_losses"] = deque(maxlen=16)
        state["_per_optimizer_states"] = defaultdict(_fresh_state)
        state["_step_info"] = defaultdict(_fresh_info)
        state["_device_steps"] = DeviceSteps()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        if state.pop("_dev", None) is not None or state.pop("_lag", 0):  # pickled before ampsafe.torch.device_scale
            raise AssertionError("this pickled GradScaler holds steps decided on the device and never reconciled")
        state.setdefault("_device_steps", DeviceSteps())
        state.setdefault("_step_info", defaultdict(_fresh_info))
        super().__setstate__(state)
        self._core.pending = _reconciler(self)


def _reconciler(scaler: GradScaler) -> Callable[[], None]:
    """``scaler._reconcile`` for ``_core.pending`` (the statistics fold in the device-decided steps first), held
    weakly: the state machine must not keep its scaler alive."""
    method = weakref.WeakMethod(scaler._reconcile)

    def pending() -> None:
        bound = method()
        if bound is not None:
            bound()

    return pending


def device_scaler(base: type, device: str) -> type:
    """``base`` (ampsafe's GradScaler or a subclass) with the signature of ``torch.{device}.amp.GradScaler``: the
    device fixed (no ``device`` argument) and torch's FutureWarning that this spelling is deprecated, so a script
    that uses the old alias sees what it saw with torch's class.

    Example::

        CudaGradScaler = device_scaler(ampsafe.torch.GradScaler, "cuda")
        scaler = CudaGradScaler(init_scale=2.0**12)   # FutureWarning, as torch.cuda.amp.GradScaler(...)
    """

    class DeviceGradScaler(base):
        """ampsafe's scaler with the device fixed (``torch.cuda.amp`` / ``torch.cpu.amp`` signature)."""

        def __init__(
            self,
            init_scale: float = 2.0**16,
            growth_factor: float = 2.0,
            backoff_factor: float = 0.5,
            growth_interval: int = 2000,
            enabled: bool = True,
            **kwargs: Any,
        ) -> None:
            warnings.warn(
                f"`torch.{device}.amp.GradScaler(args...)` is deprecated. "
                f"Please use `torch.amp.GradScaler('{device}', args...)` instead.",
                FutureWarning,
                stacklevel=2,
            )
            super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled, **kwargs)

    DeviceGradScaler.__name__ = DeviceGradScaler.__qualname__ = f"{device.capitalize()}GradScaler"
    DeviceGradScaler.__module__ = base.__module__
    return DeviceGradScaler
