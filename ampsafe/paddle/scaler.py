"""``ampsafe.paddle.GradScaler``: ``paddle.amp.GradScaler`` with a floor, a cap, a failure that names the
offending parameters, an FP32 guard mode and ``found_inf`` agreed across ranks; it never converts a shape-[1]
tensor with ``float()`` (which NumPy 2.4 refuses). On a CPU place it disables itself as Paddle's does (same
warning) unless float16 is emulated there (``emulated=True``, an open ``emulate_fp16`` block, or ``ampsafe run
--emulate-fp16``): then it scales as on a GPU.

Example::

    scaler = ampsafe.paddle.GradScaler(init_loss_scaling=2.0**16, min_loss_scaling=1.0, on_floor="raise")
    with paddle.amp.auto_cast():
        loss = model(batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)        # or scaler.minimize(optimizer, scaled_loss)
    scaler.update()
    optimizer.clear_grad()

As Paddle's, it unscales with Paddle's fused ``check_finite_and_unscale`` kernel (:mod:`ampsafe.paddle.grads`)
and hands ``found_inf`` to the optimizer through ``_set_auxiliary_var`` (the optimizer skips the update itself and
leaves a Python bool behind), so a step costs the same single host sync. Decisions come from
:mod:`ampsafe.core.scale` (float32 products, as Paddle's ``scale * ratio``); ``decr_every_n_nan_or_inf`` is the
hysteresis.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict, deque
from typing import Any, Callable, Optional

import numpy as np
import paddle
from paddle.amp import grad_scaler as _paddle_grad_scaler

from ..core.scale import (
    StepDecision,
    clamp_initial_scale,
    clampable,
    policy_for,
    policy_methods,
    policy_property,
)
from ..errors import ConfigError
from ..healing.scaler import HealingScaler
from .backend import BACKEND, amp_dtype, innermost_emulator
from .fleet import KeptMethod
from .grads import grouped, nonfinite_params, unscale_and_check_

__all__ = ["GradScaler", "OptimizerState", "amp_scaler"]

OptimizerState = _paddle_grad_scaler.OptimizerState  # Paddle's enum: per-optimizer states compare equal to Paddle's
_NAMES = ("init_loss_scaling", "min_loss_scaling", "max_loss_scaling")
_SELECTING = ("parameters", "no_grad_set")  # minimize's arguments that choose which parameters it updates
# a state dict's keys in Paddle's names -> the state machine's (LossScaleState.state_dict); Paddle's own scaler
# saves the first six, so a state dict from it loads (the others keep their values)
_STATE_KEYS = {
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
    "incr_every_n_steps": "growth_interval",
    "decr_every_n_nan_or_inf": "hysteresis",
    "incr_count": "_growth_tracker",
    "decr_count": "_overflow_tracker",
    "min_loss_scaling": "min_scale",
    "max_loss_scaling": "max_scale",
    "on_floor": "on_floor",
    "_last_clean_scale": "_last_clean_scale",
}
_PADDLES_OWN = tuple(_STATE_KEYS)[:6]


def _fresh_state() -> dict[str, Any]:
    return _paddle_grad_scaler._refresh_optimizer_state()


_CPU_REASON = (
    "disabled (CPU place: Paddle's AMP is off on a CPU; float16 is emulated only under ampsafe run --emulate-fp16, "
    "or pass emulated=True when the forward runs under ampsafe.paddle.emulate_fp16)"
)


def _tracker(name: str) -> tuple[Callable, Callable]:
    """Get and set one counter of the state machine (Paddle's ``_incr_count`` / ``_decr_count``)."""

    def get(self) -> int:
        return getattr(self._core, name)

    def set(self, value) -> None:
        setattr(self._core, name, int(value))

    return get, set


def _fp16_emulated() -> bool:
    """float16 AMP is emulated now: ``ampsafe run --emulate-fp16`` (amp_emulation installed) or an open
    ``emulate_fp16`` block."""
    from . import amp_emulation

    return amp_emulation.active() or innermost_emulator() is not None


class GradScaler(HealingScaler, _paddle_grad_scaler.GradScaler):
    """Drop-in for :class:`paddle.amp.GradScaler` (same arguments and methods), and a subclass of it (so of
    ``AmpScaler``): Paddle's private state keeps Paddle's meaning (``_scale``, ``_init_loss_scaling``,
    ``_incr_ratio``, ``_decr_ratio``, ``_incr_every_n_steps``, ``_decr_every_n_nan_or_inf``, ``_incr_count``,
    ``_decr_count``, ``_found_inf``, ``_cache_found_inf``, ``_optimizer_states``), as views of the state machine.

    Extra keyword-only arguments: ``min_loss_scaling`` / ``max_loss_scaling`` (floor, cap), ``on_floor``
    (``"raise"``, ``"clamp"``, ``"heal"``), ``group`` (ranks that agree on ``found_inf``; default: the global
    group when ``paddle.distributed`` is initialized), ``fp32_guard`` (no scaling, skip non-finite steps),
    ``callback`` (``fn(StepDecision)`` per update), ``model`` (names parameters in errors; found via the garbage
    collector when omitted). ``min_loss_scaling=0, max_loss_scaling=inf`` reproduce Paddle's scaler.

    ``on_floor="heal"`` needs no ``ampsafe.heal`` call: at its first ``step`` / ``minimize`` the scaler resolves
    its model (``model=``, else the smallest layer whose parameters cover the optimizer's) and keeps the inputs
    of its latest forward; at the floor it replays that batch under the sentinel (in the step's ``auto_cast`` or
    ``emulate_fp16``), names the pass that overflowed, and heals or raises with what it measured.
    ``patience=N`` heals after N overflowing steps in a row when the replayed forward overflows.
    ``disabled_reason``: why it is off (``"disabled by the script (enable=False)"``, ...); None when it scales or guards.

    On a CPU place Paddle's AMP is off, so, as Paddle's, it warns and disables itself there (``scale`` returns the
    loss, ``step`` / ``minimize`` just step) unless float16 is emulated: ``emulated=True`` (the caller runs its
    forward under :func:`ampsafe.paddle.emulate_fp16` on this CPU: scale as on a GPU), an ``emulate_fp16`` block
    open when it is built, or :mod:`ampsafe.paddle.amp_emulation` installed (``ampsafe run --emulate-fp16``).
    The FP32 guard (``fp32_guard=True``) does not scale and guards on any place.

    Pickling keeps the policy, scale, trackers and statistics and leaves ``model``, ``callback``, ``heal_hook``
    and instance-wrapped methods behind (they belong to the training loop); after ``pickle.loads`` re-attach
    them: ``scaler.add_step_callback(fn)``, ``ampsafe.heal(model, scaler=scaler)``.

    An ``init_loss_scaling`` outside ``[min_loss_scaling, max_loss_scaling]`` is clamped into it with one warning;
    a disabled scaler accepts whatever Paddle's disabled scaler accepts. In static mode (PIR programs) it builds
    Paddle's in-program loss scaling with its floor and cap (see :meth:`minimize`).
    """

    def __init__(
        self,
        enable: bool = True,
        init_loss_scaling: float = 2.0**16,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 2000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        *,
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float = 2.0**24,
        on_floor: str = "raise",
        group=None,
        fp32_guard: bool = False,
        callback: Optional[Callable[[StepDecision], Any]] = None,
        model=None,
        patience: Optional[int] = None,
        emulated: bool = False,
    ) -> None:
        if not isinstance(emulated, bool):
            raise ConfigError(f"emulated must be a bool, got {emulated!r}")
        self._guard = bool(fp32_guard)
        self.disabled_reason: Optional[str] = None
        if enable and not self._guard and not emulated and not _fp16_emulated():
            from .amp_emulation import amp_less_place

            place = amp_less_place()
            if place is not None:  # Paddle's AmpScaler.__init__: the same warning, then enable=False
                warnings.warn(
                    "AmpScaler can only be enabled on CUDAPlace, XPUPlace and CustomPlace, current place is "
                    f"{place}, so it makes no effect.",
                    UserWarning,
                    stacklevel=2,
                )
                enable = False
                self.disabled_reason = _CPU_REASON
        self._enable = bool(enable) or self._guard
        if not self._enable and self.disabled_reason is None:  # the FP32 guard does not scale: it guards
            self.disabled_reason = "disabled by the script (enable=False)"
        self._use_dynamic_loss_scaling = bool(use_dynamic_loss_scaling) and self._enable and not self._guard
        policy = policy_for(
            self._enable,
            _NAMES,
            init_scale=1.0 if self._guard else init_loss_scaling,
            growth_factor=incr_ratio,
            backoff_factor=decr_ratio,
            growth_interval=incr_every_n_steps,
            min_scale=min_loss_scaling,
            max_scale=max_loss_scaling,
            hysteresis=decr_every_n_nan_or_inf,
            on_floor=on_floor,
            dynamic=self._use_dynamic_loss_scaling,
            product="float32",
        )
        self._init_scaler(policy, callback, model, patience)
        self._init_loss_scaling = float(self._core.policy.init_scale) if self._enable else 1.0
        self._group = group
        self._static = not paddle.in_dynamic_mode()
        self._scale = self._static_scale() if self._static else self._scale_tensor()
        self._found_inf = None
        self._cache_found_inf = None
        self._optimizer_states: dict[int, dict[str, Any]] = defaultdict(_fresh_state)
        self._losses: deque = deque(maxlen=16)
        self._offenders: list = []

    def _scale_tensor(self):
        return paddle.to_tensor(np.array([self._core.scale], dtype=np.float32))

    # -- static graphs (PIR programs) ----------------------------------------------------------------------------------
    def _static_scale(self):
        """The persistable float32 scale of a static program (as Paddle's ``AmpScaler`` builds it), or None when
        disabled. The program's ops update it; the host state stays at its initial values."""
        if not self._enable or self._guard:
            return None
        if not paddle.framework.in_pir_mode():
            raise ConfigError(
                "ampsafe.paddle.GradScaler supports static graphs as PIR programs (Paddle's default since 3.0); "
                "this program uses the legacy IR: set FLAGS_enable_pir_api=1, or use paddle.amp.GradScaler here"
            )
        from paddle.base import unique_name

        return paddle.pir.core.create_persistable_value(
            dtype="float32",
            shape=[1],
            name=unique_name.generate("loss_scaling"),
            initializer=paddle.nn.initializer.ConstantInitializer(value=float(self._core.scale)),
        )

    def _static_fallback_note(self) -> None:
        """Say once per process what a static program cannot do, and what this scaler does instead."""
        if _STATIC_NOTE["said"]:
            return
        _STATIC_NOTE["said"] = True
        policy = self._core.policy
        lost = []
        if policy.on_floor.acts_at_floor:
            lost.append(f"on_floor={policy.on_floor.value!r} (the floor holds in the program, as on_floor='clamp')")
        if self._patience is not None:
            lost.append(f"patience={self._patience}")
        if self._guard:
            lost.append("fp32_guard")
        warnings.warn(
            "ampsafe.paddle.GradScaler in a static graph: the program updates the scale (Paddle's "
            "update_loss_scaling, then ampsafe's floor and cap), so what needs eager execution is unavailable: "
            + (", ".join(lost) + ", " if lost else "")
            + "healing, the sentinel and the step statistics. It runs as the plain robust scaler.",
            UserWarning,
            stacklevel=3,
        )

    def _static_minimize(self, optimizer, *args: Any, **kwargs: Any):
        """Paddle's static ``minimize`` (its ``OptimizerWithMixedPrecision`` appends check_finite_and_unscale and
        update_loss_scaling), then the floor and cap as one in-place clip of the persistable scale."""
        self._static_fallback_note()
        if self._guard:  # no scale to update: the program's optimizer runs as written
            return optimizer.minimize(*args, **kwargs)
        result = _paddle_grad_scaler.AmpScaler.minimize(self, optimizer, *args, **kwargs)
        policy = self._core.policy
        if self._use_dynamic_loss_scaling and (policy.min_scale > 0 or np.isfinite(policy.max_scale)):
            low = float(np.float32(policy.min_scale))
            high = float(np.float32(policy.max_scale)) if np.isfinite(policy.max_scale) else float(np.finfo("f4").max)
            paddle._C_ops.clip_(self._scale, low, high)
        return result

    # -- Paddle's private state, with Paddle's meaning (views of the state machine) ----------------------------------
    _incr_ratio = policy_property("growth_factor")
    _decr_ratio = policy_property("backoff_factor")
    _incr_every_n_steps = policy_property("growth_interval")
    _decr_every_n_nan_or_inf = policy_property("hysteresis")
    _incr_count = property(*_tracker("growth_tracker"))
    _decr_count = property(*_tracker("overflow_tracker"))

    @KeptMethod
    def _unscale(self, optimizer) -> None:
        """Paddle's private name for :meth:`unscale_`; ``fleet.distributed_scaler`` does not shadow it
        (:mod:`ampsafe.paddle.fleet`)."""
        self.unscale_(optimizer)

    def _update(self) -> None:
        """Paddle's private name for one loss-scale update from ``_cache_found_inf`` (with the floor handling)."""
        self._advance()

    # -- scale / unscale -----------------------------------------------------------------------------------------------
    def scale(self, var):
        """``var * loss_scaling`` (unchanged when disabled, in the FP32 guard, or with a bfloat16 auto_cast)."""
        if self._static and isinstance(var, paddle.pir.Value):
            self._static_fallback_note()
            return _paddle_grad_scaler.AmpScaler.scale(self, var)
        if not isinstance(var, paddle.Tensor):
            raise TypeError(f"GradScaler.scale() expects a paddle.Tensor or a PIR Value, got {type(var).__name__}")
        if self._use_dynamic_loss_scaling and amp_dtype() == "bfloat16":
            self._enable = self._use_dynamic_loss_scaling = False
            self._init_loss_scaling = 1.0
            self.disabled_reason = "disabled (bfloat16 auto_cast: dynamic loss scaling is not used for bfloat16)"
            warnings.warn("dynamic loss scaling is not recommended for bfloat16, so GradScaler is disabled.")
        if not self._enable or not var._is_initialized():
            return var
        self._losses.append(var.detach())
        if self._guard:
            return var
        return var * self._scale

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale (once per step), e.g. before gradient clipping."""
        if not self._enable:
            return
        state = self._optimizer_states[id(optimizer)]
        if state["state"] is OptimizerState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        scale = paddle.ones([1], dtype="float32") if self._guard else self._scale
        found_inf = unscale_and_check_(optimizer, scale)
        self._found_inf = self._all_reduce(found_inf)
        state["state"] = OptimizerState.UNSCALED

    def _all_reduce(self, found_inf):
        dist = paddle.distributed
        if dist.is_initialized():
            as_int = found_inf.astype("int32")
            dist.all_reduce(as_int, op=dist.ReduceOp.MAX, group=self._group)
            found_inf = as_int.astype("bool")
        return found_inf

    # -- step / update / minimize -----------------------------------------------------------------------------------
    def _optimizer_step(self, optimizer, run: Callable):
        self._resolve(optimizer)
        state = self._optimizer_states[id(optimizer)]
        if state["state"] is OptimizerState.INIT:
            self.unscale_(optimizer)
        result = None
        if hasattr(optimizer, "_set_auxiliary_var"):
            optimizer._set_auxiliary_var("found_inf", self._found_inf)
            result = run()
            found = optimizer._get_auxiliary_var("found_inf")  # the optimizer left a bool: no extra sync
        else:
            found = bool(self._found_inf)
            if not found:
                result = run()
        found = bool(found)
        self._cache_found_inf = found if self._cache_found_inf is None else (self._cache_found_inf or found)
        if found and self._names_offenders():
            self._offenders += nonfinite_params(optimizer)
        return result

    def step(self, optimizer) -> None:
        """Unscale (unless done) and run ``optimizer.step()``, which skips the update when ``found_inf``."""
        if not self._enable:
            return optimizer.step()
        state = self._optimizer_states[id(optimizer)]
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        self._optimizer_step(optimizer, optimizer.step)
        state["state"] = OptimizerState.STEPPED
        if not self._use_dynamic_loss_scaling:
            self._advance()

    def minimize(self, optimizer, *args: Any, **kwargs: Any):
        """``step`` + ``update`` through ``optimizer.minimize(*args, **kwargs)``; returns what that returns. In a
        static program it appends Paddle's in-program loss scaling, then the floor and cap, to the program.

        An optimizer built with parameter groups is stepped by ``optimizer.step()`` (when the call names no
        ``parameters`` or ``no_grad_set``): Paddle's ``Optimizer.minimize`` hands the group dicts to ``backward``,
        which takes tensors, so Paddle's own scaler raises a TypeError there (PaddleDetection's RT-DETRv2 under
        ``--amp``), and ``step()`` applies each group with its own options."""
        if self._static and self._enable:
            return self._static_minimize(optimizer, *args, **kwargs)
        if not self._enable:
            return optimizer.minimize(*args, **kwargs)
        selects = any(a is not None for a in args[2:]) or any(kwargs.get(k) is not None for k in _SELECTING)
        run = optimizer.step if grouped(optimizer) and not selects else lambda: optimizer.minimize(*args, **kwargs)
        result = self._optimizer_step(optimizer, run)
        self._advance()
        return result if result is not None else (None, None)

    def update(self) -> None:
        """Advance the loss-scaling state machine; at the floor apply ``on_floor``."""
        if not self._enable or not self._use_dynamic_loss_scaling:
            return
        self._advance()

    def _advance(self) -> None:
        self._end_update(self._gather)

    def _gather(self) -> Optional[tuple]:
        """The step for :meth:`ScalerBase._end_update`: (found_inf, offenders, losses), or None when nothing was
        stepped since the last update (nothing to decide: in Paddle a no-op)."""
        found = self._cache_found_inf
        self._optimizer_states = defaultdict(_fresh_state)
        self._cache_found_inf = None
        offenders, self._offenders = self._offenders, []
        losses = list(self._losses)
        self._losses.clear()
        return None if found is None else (found, offenders, losses)

    # -- the framework of the floor's replay and heal (HealingScaler: its precision is ``backend.amp``) -----------
    def _backend(self):
        return BACKEND

    # -- the tensor side of ScalerBase's floor handling -------------------------------------------------------------
    _wrappers = frozenset().union(*BACKEND.wrappers.values())

    def _refresh_scale(self) -> None:
        self._scale = self._scale_tensor()

    # -- Paddle's getters / setters ------------------------------------------------------------------------------
    def is_enable(self) -> bool:
        """Whether loss scaling is on (False in the FP32 guard, whose guard still skips non-finite steps)."""
        return self._enable and not self._guard

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._use_dynamic_loss_scaling

    def get_loss_scaling(self) -> float:
        """The current loss scaling as a Python float (no device sync: the host knows it)."""
        return float(self._core.scale) if self._enable else 1.0

    def get_init_loss_scaling(self) -> float:
        return self._init_loss_scaling

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """As Paddle's: also resets the current scale to the new value (clamped into the bounds, with a warning)."""
        value = new_init_loss_scaling
        policy = self._core.policy
        if policy.dynamic and clampable(value, policy.min_scale, policy.max_scale):
            value = clamp_initial_scale(value, policy.min_scale, policy.max_scale, _NAMES)
        self._core.set_scale(value)
        self._set_policy(init_scale=float(self._core.scale))
        self._init_loss_scaling = new_init_loss_scaling if value == new_init_loss_scaling else value
        self._scale = self._scale_tensor()

    get_incr_ratio, set_incr_ratio = policy_methods("growth_factor")
    get_decr_ratio, set_decr_ratio = policy_methods("backoff_factor")
    get_incr_every_n_steps, set_incr_every_n_steps = policy_methods("growth_interval")
    get_decr_every_n_nan_or_inf, set_decr_every_n_nan_or_inf = policy_methods("hysteresis")

    def state_dict(self) -> dict:
        """Paddle's keys (``scale`` as a float32 array of shape [1], ``incr_ratio``, ..., ``incr_count``,
        ``decr_count``, ``use_dynamic_loss_scaling``) plus ``min_loss_scaling``, ``max_loss_scaling``,
        ``on_floor`` and ``_last_clean_scale``. Empty when disabled, as Paddle's."""
        if not self._enable:
            return {}
        core = self._core.state_dict()
        return {
            "scale": np.array([self._core.scale], dtype=np.float32),
            **{key: core[ours] for key, ours in _STATE_KEYS.items()},
            "use_dynamic_loss_scaling": self._use_dynamic_loss_scaling,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from this class or from ``paddle.amp.GradScaler`` (without ampsafe's keys)."""
        if not self._enable:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The input state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        sd = state_dict
        scale = sd["scale"]
        scale = float(np.asarray(scale.numpy() if isinstance(scale, paddle.Tensor) else scale).reshape(-1)[0])
        core = {ours: sd[key] for key, ours in _STATE_KEYS.items() if key in sd or key in _PADDLES_OWN}
        self._use_dynamic_loss_scaling = bool(sd.get("use_dynamic_loss_scaling", self._use_dynamic_loss_scaling))
        self._set_policy(dynamic=self._use_dynamic_loss_scaling)
        self._core.load_state_dict({"scale": scale, **core})
        self._init_loss_scaling = scale
        self._scale = self._scale_tensor()

    def __getstate__(self) -> dict:
        """The scale, policy, trackers and statistics; not the model, callbacks or hooks (see
        :meth:`ScalerBase.__getstate__`: re-attach them after loading). Only between iterations (before
        ``unscale_``/``step``, or after ``update``/``minimize``): a step in flight holds gradients' verdicts."""
        if self._cache_found_inf is not None or any(
            s["state"] is not OptimizerState.INIT for s in self._optimizer_states.values()
        ):
            raise AssertionError(self.MID_ITERATION)
        state = super().__getstate__()
        state["_scale"] = None  # rebuilt from the state in __setstate__
        state["_found_inf"] = None
        state["_optimizer_states"] = defaultdict(_fresh_state)
        state["_losses"] = deque(maxlen=16)
        state["_offenders"] = []
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._scale = self._scale_tensor()


_STATIC_NOTE = {"said": False}


# where paddle.amp.AmpScaler's constructor differs from its GradScaler's: two defaults
_AMP_SCALER_DEFAULTS = {"init_loss_scaling": 2.0**15, "incr_every_n_steps": 1000}


def _amp_signature() -> inspect.Signature:
    """``AmpScaler.__init__``'s: :class:`GradScaler`'s positional parameters under :data:`_AMP_SCALER_DEFAULTS`,
    then ``**kwargs`` (ampsafe's keyword-only options, passed through)."""
    params = [
        p for p in inspect.signature(GradScaler.__init__).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    params = [p.replace(default=_AMP_SCALER_DEFAULTS.get(p.name, p.default)) for p in params]
    return inspect.Signature([*params, inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


def amp_scaler(base: type) -> type:
    """``base`` (ampsafe's GradScaler or a subclass) with ``paddle.amp.AmpScaler``'s defaults
    (``init_loss_scaling=2**15``, ``incr_every_n_steps=1000``): what a script that builds an ``AmpScaler`` gets.

    Example::

        AmpScaler = amp_scaler(ampsafe.paddle.GradScaler)
        scaler = AmpScaler(init_loss_scaling=1024)   # scale / minimize as Paddle's AmpScaler
    """

    signature = _amp_signature()

    class AmpScaler(base):
        """ampsafe's scaler with ``paddle.amp.AmpScaler``'s signature and defaults."""

        def __init__(self, *args, **kwargs) -> None:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            super().__init__(*bound.args[1:], **bound.kwargs)

        __init__.__signature__ = signature

    AmpScaler.__module__ = base.__module__
    return AmpScaler
