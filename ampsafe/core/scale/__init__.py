"""The loss-scale state machine both GradScalers share, by concern:

    policy  ScalePolicy (plain data, validated) and the accessors of its fields
    state   LossScaleState (the transitions) and the records it keeps: StepDecision, ScalerStats, HealRecord,
            HealPlan, FloorInfo, BelowFloor
    floor   what a floor hit does, one handler per OnFloor value, and the floor's message and error
    base    ScalerBase: a step's end and the floor dispatch the adapters share

Every name is importable from here (``from ampsafe.core.scale import ScalerBase``).
"""

from ..amp import ON_FLOOR, OnFloor
from . import base, floor, policy, state
from .base import *  # noqa: F403
from .floor import *  # noqa: F403
from .policy import *  # noqa: F403
from .state import *  # noqa: F403

__all__ = [*policy.__all__, *state.__all__, *floor.__all__, *base.__all__, "OnFloor", "ON_FLOOR"]
