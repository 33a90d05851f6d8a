"""Read the ``Architecture``, ``Loss`` and ``PostProcess`` sections of a PaddleOCR detection config.

The default is the upstream ``configs/det/det_mv3_db.yml`` (the seed report's model), read from the copy shipped
in the package (``ampsafe_lab/workloads/data/upstream``, see :mod:`ampsafe_lab.workloads.upstream`) or, when
``AMPSAFE_SHARED`` is set, from ``$AMPSAFE_SHARED/upstream``; when that folder lacks it, an equivalent built-in
copy of those sections is used so the workload still builds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Union

from ampsafe.errors import ConfigError

from ..upstream import upstream_root

__all__ = ["BUILTIN_DET_MV3_DB", "upstream_configs", "default_config_path", "load_config"]

# The sections of PaddleOCR's configs/det/det_mv3_db.yml this workload reads.
BUILTIN_DET_MV3_DB: dict[str, Any] = {
    "Architecture": {
        "model_type": "det",
        "algorithm": "DB",
        "Transform": None,
        "Backbone": {"name": "MobileNetV3", "scale": 0.5, "model_name": "large"},
        "Neck": {"name": "DBFPN", "out_channels": 256},
        "Head": {"name": "DBHead", "k": 50},
    },
    "Loss": {
        "name": "DBLoss",
        "balance_loss": True,
        "main_loss_type": "DiceLoss",
        "alpha": 5,
        "beta": 10,
        "ohem_ratio": 3,
    },
    "PostProcess": {
        "name": "DBPostProcess",
        "thresh": 0.3,
        "box_thresh": 0.6,
        "max_candidates": 1000,
        "unclip_ratio": 1.5,
    },
}


def upstream_configs() -> Path:
    """``<upstream>/PaddleOCR/configs``: the package's copy, or ``$AMPSAFE_SHARED/upstream/...`` when that is set."""
    return upstream_root() / "PaddleOCR" / "configs"


def default_config_path() -> Path:
    return upstream_configs() / "det" / "det_mv3_db.yml"


def _find_named(name: str) -> Path | None:
    stem = name[:-4] if name.endswith(".yml") else name
    root = upstream_configs()
    if not root.is_dir():
        return None
    direct = root / "det" / f"{stem}.yml"
    if direct.is_file():
        return direct
    matches = sorted(root.rglob(f"{Path(stem).name}.yml"))
    return matches[0] if matches else None


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read PaddleOCR config {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a PaddleOCR config (top level is not a mapping)")
    return data


def load_config(config: Union[str, Path, dict, None] = None) -> dict:
    """Return a config dict with at least ``Architecture`` and ``Loss``.

    ``config``: None (upstream det_mv3_db.yml, or the built-in copy if the upstream folder lacks it), a path to a YAML
    file, a config name such as ``"det_r50_vd_db"`` or ``"ch_ppocr_v2.0/ch_det_mv3_db_v2.0"`` (looked up under
    the upstream configs), or a dict (copied). Keys other than the three sections read are kept, untouched.
    """
    if config is None:
        path = default_config_path()
        data = _read_yaml(path) if path.is_file() else copy.deepcopy(BUILTIN_DET_MV3_DB)
    elif isinstance(config, dict):
        data = copy.deepcopy(config)
    elif isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            found = _find_named(str(config))
            if found is None:
                if str(config) in ("det_mv3_db", "det_mv3_db.yml"):
                    return copy.deepcopy(BUILTIN_DET_MV3_DB)
                raise ConfigError(
                    f"config {str(config)!r} is neither a file nor a config name under {upstream_configs()}"
                )
            path = found
        data = _read_yaml(path)
    else:
        raise ConfigError(f"config must be a path, a config name or a dict, got {type(config).__name__}")
    for section in ("Architecture", "Loss"):
        if not isinstance(data.get(section), dict):
            raise ConfigError(f"config has no {section} section (a PaddleOCR detection config needs one)")
    data.setdefault("PostProcess", copy.deepcopy(BUILTIN_DET_MV3_DB["PostProcess"]))
    return data
