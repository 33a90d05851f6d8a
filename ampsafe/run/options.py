"""``ampsafe run``'s options as one typed value: :class:`RunOptions`.

Why: the parent process (the command line and a config's ``ampsafe:`` section), the child process (an
environment variable) and ``ampsafe.auto.install(...)`` (a notebook) all state the same options. One frozen
dataclass validated once at construction means a bad value is refused where it was written, each name is
spelled once, and what each framework calls an option (Paddle's ``min_loss_scaling``) is stated here, not in the
middle of the code that builds its scaler: each backend's ``amp.scaler_args`` names them. Pure Python: imports
no framework, and names none.

    options = RunOptions.from_cli(args, config_section)   # the parent
    env[ENV_OPTIONS] = options.to_env()                   # handed to the child
    options = RunOptions.from_env()                       # the child (defaults when unset)
    options.scaler_kwargs(backend.amp.scaler_args)        # Paddle: {"min_loss_scaling": 1.0, "on_floor": "heal"}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..core.amp import ON_FLOOR
from ..errors import ConfigError

__all__ = ["RunOptions", "ON_FLOOR", "ON_BAD_TARGET", "ENV_OPTIONS", "ENV_REPORT", "DEFAULT_REPORT_DIR"]

ENV_OPTIONS = "AMPSAFE_RUN_OPTIONS"  # JSON options, read by the child
ENV_REPORT = "AMPSAFE_RUN_REPORT"  # a directory: each process of the command writes <pid>.json there at exit
ON_BAD_TARGET = ("raise", "drop")
DEFAULT_REPORT_DIR = "ampsafe-run"

SCALER_ARGS = ("min_scale", "on_floor")  # the options a run's scaler takes (``Amp.scaler_args`` renames them)


@dataclass(frozen=True)
class RunOptions:
    """The options in force for one ``ampsafe run`` (or ``import ampsafe.auto``), checked when built.

    ``on_floor``: what a scaler does at its floor (heal | raise | clamp); ``min_scale``: the loss-scale floor (0:
    none, the frameworks' own behaviour); ``watch``: the NaN/Inf sentinel on the trained model; ``max_skips``: the
    FP32 guard stops after more than this many skipped steps in a row (a handful is a bad batch, ten in a row a
    diverged run); ``on_bad_target``: raise | drop a bad detection box; ``report``: the folder of report.md /
    report.json / scale.png (None: no report); ``emulate_fp16``: float16 AMP emulated on a CPU; ``quiet``: no
    per-patch lines from the child; ``metrics``: the ``amp/*`` metrics go to the loggers of the trainers the
    script builds (HF ``Trainer``, Lightning, mmengine, ultralytics, PaddleOCR / PaddleDetection: their hosts,
    :mod:`ampsafe.hosts`); ``tensorboard``: a folder where every scaler of the run writes its ``amp/*`` metrics
    at each optimizer step (a TensorBoard event file, :mod:`ampsafe.run.board`; None: none); ``headroom_every``:
    the float16 headroom of the scanned paths is sampled in every N-th step's own forward
    (:mod:`ampsafe.run.headroom`; 0: off); ``underflow``: on those sampled steps, and on a float16 step with no
    scaler, the gradients' float16 underflow is measured too (:mod:`ampsafe.core.underflow`; a host copy of every
    gradient per sample).
    """

    on_floor: str = "heal"
    min_scale: float = 1.0
    watch: bool = False
    max_skips: int = 10
    on_bad_target: str = "raise"
    report: str | None = DEFAULT_REPORT_DIR
    emulate_fp16: bool = False
    quiet: bool = False
    metrics: bool = True
    tensorboard: str | None = None
    headroom_every: int = 10
    underflow: bool = True

    def __post_init__(self) -> None:
        if self.on_floor not in ON_FLOOR:
            raise ConfigError(f"on_floor must be one of {', '.join(ON_FLOOR)}, got {self.on_floor!r}")
        if isinstance(self.min_scale, bool):
            raise ConfigError(f"min_scale must be a number, got {self.min_scale!r}")
        try:
            min_scale = float(self.min_scale)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"min_scale must be a number, got {self.min_scale!r}") from exc
        if not (min_scale >= 0 and math.isfinite(min_scale)):  # 0: no floor (the frameworks' own behaviour)
            raise ConfigError(f"min_scale must be >= 0, got {self.min_scale}")
        if isinstance(self.max_skips, bool) or not isinstance(self.max_skips, int) or self.max_skips < 0:
            raise ConfigError(f"max_skips must be an int >= 0, got {self.max_skips!r}")
        if self.on_bad_target not in ON_BAD_TARGET:
            raise ConfigError(f"on_bad_target must be one of {', '.join(ON_BAD_TARGET)}, got {self.on_bad_target!r}")
        every = self.headroom_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ConfigError(f"headroom_every must be an int >= 0 (0: off), got {every!r}")
        for name in ("watch", "emulate_fp16", "quiet", "metrics", "underflow"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        report = None if self.report in (None, "") else self.report
        if report is not None and not isinstance(report, (str, os.PathLike)):
            raise ConfigError(f"report must be a folder path or None, got {report!r}")
        tensorboard = None if self.tensorboard in (None, "") else self.tensorboard
        if tensorboard is not None and not isinstance(tensorboard, (str, os.PathLike)):
            raise ConfigError(f"tensorboard must be a folder path or None, got {tensorboard!r}")
        if tensorboard is not None and not self.metrics:
            raise ConfigError(
                f"tensorboard={os.fspath(tensorboard)!r} asks for amp/* metrics and metrics=False (--no-metrics) "
                "turns them off: give one of the two"
            )
        object.__setattr__(self, "tensorboard", None if tensorboard is None else os.fspath(tensorboard))
        object.__setattr__(self, "min_scale", min_scale)
        object.__setattr__(self, "report", None if report is None else os.fspath(report))

    # -- construction
    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "options") -> RunOptions:
        """From a mapping of option names (``-`` or ``_`` spelled); unknown names are refused, naming ``where``."""
        values = {str(k).replace("-", "_"): v for k, v in values.items()}
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise ConfigError(f"{where}: unknown option(s) {unknown}; known: {', '.join(cls.names())}")
        return cls(**values)

    @classmethod
    def from_cli(cls, args, config: Mapping[str, Any] | None = None) -> RunOptions:
        """The command line (an ``argparse`` namespace whose unset options are None) over a config's ``ampsafe:``
        section over the defaults."""
        values = dict(config or {})
        for name in cls.names():
            value = getattr(args, name, None)
            if value is not None:
                values[name] = value
        return cls.from_mapping(values, where="ampsafe: section of the config")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunOptions:
        """What ``ampsafe run`` handed its child in ``AMPSAFE_RUN_OPTIONS``; when unset (``import ampsafe.auto``
        in a notebook), the defaults of ``ampsafe.auto.install()``: no report folder, the parent writes reports."""
        raw = (os.environ if environ is None else environ).get(ENV_OPTIONS)
        if not raw:
            return cls(report=None)
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{ENV_OPTIONS} is not JSON ({exc}): {raw[:200]!r}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"{ENV_OPTIONS} must be a JSON object, got {raw[:200]!r}")
        return cls.from_mapping(data, where=ENV_OPTIONS)

    def to_env(self) -> str:
        """The value of ``AMPSAFE_RUN_OPTIONS`` that :meth:`from_env` reads back as these options."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> RunOptions:
        return dataclasses.replace(self, **changes)

    # -- per framework
    def scaler_kwargs(self, names: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The floor options as a framework's GradScaler spells them: ``names`` is its ``amp.scaler_args``
        (Paddle's ``min_loss_scaling``); None: as the options are named (torch's spelling too)."""
        names = names or {}
        return {names.get(name, name): getattr(self, name) for name in SCALER_ARGS}

    def scaler_text(self, names: Mapping[str, str] | None = None) -> str:
        """``min_loss_scaling=1.0, on_floor='heal'``: the floor as the framework's scaler is told it."""
        return ", ".join(f"{k}={v!r}" for k, v in self.scaler_kwargs(names).items())
