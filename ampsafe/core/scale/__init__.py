"""The loss-scale state machine both GradScalers share, by concern:

    policy  ScalePolicy (plain data, validated) and the accessors of its fields
    state   LossScaleState (the transitions) and the records it keeps: StepDecision, ScalerStats, HealRecord,
            HealPlan, FloorInfo, BelowFloor
    floor   what a floor hit does, one handler per OnFloor value, and the floor's message and error
    base    ScalerBase: a step's end and the floor dispatch the adapters share

Every name is importable from here (``from ampsafe.core.scale import ScalerBase``).
"""

from ..amp import ON_FLOOR, OnFloor
from .base import ScalerBase, StepEvidence
from .floor import (
    ClampAtFloor,
    FloorHandler,
    HookAtFloor,
    RaiseAtFloor,
    floor_error,
    floor_message,
    names_from_live_modules,
)
from .policy import (
    ScalePolicy,
    clamp_initial_scale,
    clampable,
    policy_for,
    policy_methods,
    policy_property,
)
from .state import (
    LOWEST_SCALE,
    BelowFloor,
    FloorInfo,
    HealPlan,
    HealRecord,
    LossScaleState,
    ScalerStats,
    StepDecision,
)

__all__ = [
    "ScalePolicy",
    "LossScaleState",
    "clamp_initial_scale",
    "policy_for",
    "StepDecision",
    "ScalerStats",
    "HealRecord",
    "HealPlan",
    "FloorInfo",
    "BelowFloor",
    "LOWEST_SCALE",
    "OnFloor",
    "ON_FLOOR",
    "floor_message",
    "floor_error",
    "names_from_live_modules",
    "clampable",
    "policy_methods",
    "policy_property",
    "ScalerBase",
    "StepEvidence",
    "FloorHandler",
    "RaiseAtFloor",
    "ClampAtFloor",
    "HookAtFloor",
]
