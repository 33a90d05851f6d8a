"""DeepSpeed's loss scale with ampsafe's floor, cap and heal: :func:`wrap` (``ampsafe.deepspeed.wrap``).

Why here: a DeepSpeed engine owns its loss scale, and which of three implementations it uses depends on its config
(:class:`Mode`): ZeRO 1-3 ``"fp16"`` decide in a ``DynamicLossScaler`` (which raises "Current loss scale already
at minimum" at its floor), ZeRO-0 ``"fp16"`` in ``FP16_Optimizer._update_scale`` (which clamps and skips forever),
``"torch_autocast"`` float16 in a plain ``torch.amp.GradScaler`` (the engine's under ZeRO-0, the ZeRO optimizer's
under ZeRO 1-3, where ZeRO skips an overflowing step before the scaler hears of it). :func:`wrap` puts ampsafe's
decision in each: for ``"fp16"`` a :class:`DeepSpeedScale` decides in the optimizer's ``_update_scale`` (an
instance attribute, so DeepSpeed's own loss-scaler object, which ``save_checkpoint`` pickles, stays DeepSpeed's
class) and writes its scale back; for ``torch_autocast`` the scaler is ampsafe's GradScaler, told the steps ZeRO
skipped. Every decision sees the overflow after DeepSpeed all-reduced it, so all ranks hit the floor together and
heal together (:class:`~ampsafe.healing.Healer` all-gathers its verdicts: every rank islands the same modules).

The model a heal replays is ``engine.module``, called directly: the engine's own ``forward`` would turn
``torch_autocast`` back on inside a float32 replay. Under ``"fp16"`` its parameters are float16, so an island
upcasts them for its forward (:class:`~ampsafe.torch.swaps.FP32Island`).
"""

from __future__ import annotations

import enum
import functools
import json
import weakref
from typing import Optional

from ..core.scale import policy_for
from ..healing.scaler import HealingScaler

__all__ = ["Mode", "mode_of", "wrap", "DeepSpeedScale", "fix_lines"]

MARK = "__ampsafe_deepspeed__"  # set on a wrapped engine: what wrap() put in place


class Mode(str, enum.Enum):
    """Which DeepSpeed implementation decides the loss scale of an engine."""

    ZERO_FP16 = "ZeRO 1-3 fp16 (DynamicLossScaler)"
    ZERO0_FP16 = "ZeRO-0 fp16 (FP16_Optimizer / FP16_UnfusedOptimizer)"
    AUTOCAST_ZERO0 = "torch_autocast float16, ZeRO-0 (engine.torch_autocast_z0_gradscaler)"
    AUTOCAST_ZERO = "torch_autocast float16, ZeRO 1-3 (optimizer.torch_autocast_gradscaler)"

    @property
    def autocast(self) -> bool:
        return self in (Mode.AUTOCAST_ZERO0, Mode.AUTOCAST_ZERO)


def mode_of(engine) -> Optional[Mode]:
    """The engine's loss-scale implementation, or None when it scales nothing (bf16, float32, a static scale)."""
    optimizer = getattr(engine, "optimizer", None)
    if getattr(engine, "torch_autocast_z0_gradscaler", None) is not None:
        return Mode.AUTOCAST_ZERO0
    if getattr(optimizer, "torch_autocast_gradscaler", None) is not None:
        return Mode.AUTOCAST_ZERO
    if getattr(getattr(optimizer, "loss_scaler", None), "dynamic", False):
        return Mode.ZERO_FP16
    if getattr(getattr(optimizer, "loss_scale_config", None), "dynamic_loss_scale", False):
        return Mode.ZERO0_FP16
    return None


class DeepSpeedScale(HealingScaler):
    """ampsafe's scale decisions for a DeepSpeed ``"fp16"`` engine: DeepSpeed's optimizer asks it at every step
    (``_update_scale(overflow)``) and holds the scale it decides (``loss_scaler.cur_scale`` /
    ``loss_scale_config.cur_scale``). Starts from DeepSpeed's scale, window and hysteresis; a scale DeepSpeed
    holds that this did not write (``load_checkpoint``) is taken over as a reload."""

    disabled_reason = None

    def __init__(self, engine, mode: Mode, *, min_scale: float, max_scale: float, on_floor: str, patience=None):
        self.mode = mode
        self._engine = weakref.ref(engine)
        held = self._held()
        window, hysteresis = self._ds_window()
        policy = policy_for(
            True,
            init_scale=float(held),
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=int(window),
            min_scale=min_scale,
            max_scale=max_scale,
            hysteresis=int(hysteresis),
            on_floor=on_floor,
            product="float64",
        )
        self._init_scaler(policy, None, engine.module, patience)
        self._written = None
        self._refresh_scale()
        self._resolve(None)  # the model is known: its inputs are captured from the first forward on

    # -- DeepSpeed's side -------------------------------------------------------------------------------------------
    @property
    def engine(self):
        return self._engine()

    def _holder(self):
        optimizer = self.engine.optimizer
        return optimizer.loss_scaler if self.mode is Mode.ZERO_FP16 else optimizer.loss_scale_config

    def _held(self) -> float:
        return float(self._holder().cur_scale)

    def _ds_window(self) -> tuple[int, int]:
        holder = self._holder()
        if self.mode is Mode.ZERO_FP16:
            return holder.scale_window, holder.delayed_shift
        return holder.scale_window, 1

    def _refresh_scale(self) -> None:
        """DeepSpeed holds the scale ampsafe decided (the next backward multiplies the loss by it)."""
        holder = self._holder()
        holder.cur_scale = self._written = float(self._core.scale)
        if self.mode is Mode.ZERO_FP16:
            holder.cur_hysteresis = holder.delayed_shift

    def update_scale(self, overflow: bool) -> None:
        """One step's decision (DeepSpeed's ``_update_scale``): backoff, growth, the floor (raise, clamp, heal)."""
        held = self._held()
        if held != self._written:  # load_checkpoint (or the script) set DeepSpeed's scale: continue from it
            self._core.set_scale(held)
        self._end_update(
            lambda: (bool(overflow), self._offenders() if overflow and self._names_offenders() else [], [])
        )

    def _names_every_overflow(self) -> bool:
        """Under ZeRO 1-2 each full gradient is gathered from its partitions (a collective per parameter): named at
        the floor only; the backward trace still names an activation gradient's module on the steps after one."""
        return self.mode is not Mode.ZERO_FP16

    def _offenders(self) -> list:
        """(parameter, name) of the non-finite gradients, named by the engine (``engine.param_names``); under
        ZeRO 1-2 each full gradient is read back from its partitions (DeepSpeed's ``safe_get_full_grad``, the same
        collective on every rank: all ranks are at the floor together)."""
        engine = self.engine
        names = getattr(engine, "param_names", {}) or {}
        out = []
        for name, param in engine.module.named_parameters():
            grad = _full_grad(param) if self.mode is Mode.ZERO_FP16 else param.grad
            if grad is not None and not bool(grad.isfinite().all()):
                out.append((param, names.get(param, name)))
        return out

    # -- what HealingScaler and ampsafe run ask ---------------------------------------------------------------------
    def _backend(self):
        from .backend import BACKEND

        return BACKEND

    def _run_scale(self) -> float:
        return float(self._core.scale)

    def _run_guards(self) -> bool:
        return True

    def get_scale(self) -> float:
        return float(self._core.scale)

    def fix_lines(self, paths) -> dict[str, tuple[str, str]]:
        """The report's DeepSpeed lines for the healed ``paths`` (:func:`fix_lines`)."""
        return fix_lines(self.mode, paths)

    def _builtin_heal_hook(self):
        """The Healer of ``engine.module``, whose scan sees the float16 parameters and inputs as float32 (the scan
        is the float32 reference: a float16 module run "without autocast" is still float16)."""
        if self._healer is None and self._resolved is not None:
            from ..healing.healer import Healer

            options = self._backend().amp.heal_options(self._capture.state)
            self._healer = Healer(
                self._resolved, backend=self._backend(), capture=self._capture, scan=_scan_in_float32, **options
            )
        return self._healer


def _scan_in_float32(model, inputs, **kwargs):
    """``ampsafe.scan`` of a model cast to float16 as if it were float32: its parameters' data upcast for the scan
    (the same tensors put back after: ZeRO's parameters are views of its flat buffers), the inputs upcast."""
    from ..healing.fronts import fronts
    from .swaps import _to_float32
    from .tensors import LOW_DTYPES

    low = [(p, p.data) for p in model.parameters() if p.dtype in LOW_DTYPES]
    for p, data in low:
        p.data = data.float()
    try:
        return fronts().scan(model, _to_float32(inputs), **kwargs)
    finally:
        for p, data in low:
            p.data = data


def _full_grad(param):
    try:
        from deepspeed.utils import safe_get_full_grad

        return safe_get_full_grad(param)
    except Exception:  # noqa: BLE001 - naming is evidence; the verdict stands without it
        return param.grad


def _autocast_scaler(engine, mode: Mode, floor: dict):
    """The ``torch_autocast`` GradScaler as ampsafe's (built by ``ampsafe run`` already, or replaced now, its state
    carried over), replaying ``engine.module``; under ZeRO 1-3 it is told of the steps ZeRO skips before it."""
    from .scaler import GradScaler

    owner = engine if mode is Mode.AUTOCAST_ZERO0 else engine.optimizer
    attr = "torch_autocast_z0_gradscaler" if mode is Mode.AUTOCAST_ZERO0 else "torch_autocast_gradscaler"
    scaler = getattr(owner, attr)
    if not isinstance(scaler, GradScaler):
        mine = GradScaler(scaler._device, init_scale=scaler.get_scale(), model=engine.module, **floor)
        setattr(owner, attr, mine)
        scaler = mine
    elif not scaler._resolve_done:
        scaler._model = engine.module  # replay the module, not the engine (whose forward turns autocast on)
    # resolved now, not at its first step(): under ZeRO 1-3 an overflow from the first step on never reaches step()
    scaler._resolve(None)
    if mode is Mode.AUTOCAST_ZERO:
        optimizer = engine.optimizer
        original = optimizer._update_scale

        def _update_scale(has_overflow=False):
            original(has_overflow)
            if has_overflow:  # ZeRO skips the step before torch_autocast_gradscaler.step/update would see it
                scaler._end_update(lambda: (True, [], []))

        optimizer._update_scale = _update_scale  # on the instance: DeepSpeed's step calls self._update_scale
    return scaler


def wrap(
    engine,
    *,
    min_scale: float = 1.0,
    max_scale: float = 2.0**24,
    on_floor: str = "heal",
    patience: Optional[int] = None,
):
    """Put ampsafe's floor, cap and heal into ``engine``'s loss scale (a ``deepspeed.DeepSpeedEngine``, as
    ``deepspeed.initialize`` returns it), whichever implementation its config chose (:class:`Mode`).

    Returns the object that now decides the scale (a :class:`DeepSpeedScale`, or the ``torch_autocast`` mode's
    :class:`ampsafe.torch.GradScaler`): its ``stats`` count the steps, skips, floor hits and heals. ``on_floor``:
    ``"heal"`` (replay the batch, island what overflows on every rank, restore the scale), ``"raise"``
    (:class:`~ampsafe.LossScaleFloorError` naming what overflowed) or ``"clamp"`` (DeepSpeed ZeRO-0's skipping).
    An engine with no dynamic float16 scale (bf16, float32, a static ``loss_scale``) is returned None, unchanged.
    Wrapping twice returns the first wrap's object.
    """
    done = getattr(engine, MARK, None)
    if done is not None:
        return done
    mode = mode_of(engine)
    if mode is None:
        return None
    floor = {"min_scale": min_scale, "max_scale": max_scale, "on_floor": on_floor, "patience": patience}
    if mode.autocast:
        scale = _autocast_scaler(engine, mode, floor)
    else:
        scale = DeepSpeedScale(engine, mode, **floor)
        # on the instance: DeepSpeed's step calls self._update_scale; its loss-scaler object is left as it was
        engine.optimizer._update_scale = lambda has_overflow=False: scale.update_scale(has_overflow)
    scale.deepspeed_mode = mode
    if mode.autocast:  # the report's DeepSpeed lines (DeepSpeedScale has them as a method)
        scale.fix_lines = functools.partial(fix_lines, mode)
    setattr(engine, MARK, scale)
    return scale


def fix_lines(mode: Optional[Mode], paths) -> dict[str, tuple[str, str]]:
    """The DeepSpeed-side permanent fix of healed ``paths``: key -> (line, advice). The island line on the
    engine's module (right after ``deepspeed.initialize``, or on the model before it), and under ``"fp16"`` (every
    parameter float16) the config switch that keeps parameters float32 and computes float16 under autocast."""
    if mode is None or not paths:
        return {}
    island = f'ampsafe.patch(engine.module, policy="island", paths={json.dumps(list(paths))})'
    out = {
        "deepspeed_island": (
            island,
            f"DeepSpeed ({mode.value}): the same modules as FP32 islands on the engine's module, right after "
            "`deepspeed.initialize` (or on the model before it):",
        )
    }
    if not mode.autocast:
        out["deepspeed_config"] = (
            '"torch_autocast": {"enabled": true, "dtype": "float16"}',
            "Classic DeepSpeed fp16 casts every parameter to float16, so an island there upcasts float16 weights at "
            'each call. When these modules need float32 weights, replace the config\'s "fp16" section by '
            "DeepSpeed's torch_autocast mode (parameters stay float32, autocast computes in float16), with the "
            "island line above:",
        )
    return out
