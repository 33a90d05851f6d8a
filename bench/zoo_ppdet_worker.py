"""The in-process half of bench/zoo_ppdet.py: runs inside a child whose ``PYTHONPATH`` puts the PaddleDetection
source tree first, so ``ppdet`` is that tree's, not the installed 2.6.0.

    python -m bench.zoo_ppdet_worker enumerate OUT.json          # every config: its merged signature
    python -m bench.zoo_ppdet_worker scan OVERLAY OUT.json        # build + ampsafe.scan at O1 and O2
    python -m bench.zoo_ppdet_worker record CONFIGS NAME OUT.json # one config's signature and recipe
    python -m bench.zoo_ppdet_worker records CONFIGS OUTDIR NAME...  # many, one OUTDIR/<name>.json each
    python -m bench.zoo_ppdet_worker suite CONFIGS OUT DATA SIZE NAME...  # the CI subset, in one process

Why a child per scan: ppdet keeps one process-wide config (``global_config``) that every ``load_config`` merges
into, and a failed build can leave it half-merged; a child per config starts clean and its crash is one row.
The enumeration loads all configs in one process, each inside the lab's clean-registry context.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

__all__ = ["signature", "enumerate_tree", "build_and_scan", "frozen_norms", "dataset_spec"]

# the keys of an architecture's config that name its backbone / neck; every other class-valued key except the
# post-processing ones is part of its head
BACKBONE_KEYS = ("backbone",)
NECK_KEYS = ("neck", "fpn")
NOT_HEAD = ("post_process", "post_processor", "bbox_post_process", "mask_post_process", "post_proccess")


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def signature(cfg: dict, registered: set[str]) -> dict:
    """architecture + backbone + neck + head class names, read from the merged config."""
    arch = cfg.get("architecture")
    parts = cfg.get(arch) or {}
    named = {k: v for k, v in parts.items() if isinstance(v, str) and v in registered}
    backbone = next((named[k] for k in BACKBONE_KEYS if k in named), None)
    neck = next((named[k] for k in NECK_KEYS if k in named), None)
    head = "+".join(v for k, v in named.items() if k not in BACKBONE_KEYS + NECK_KEYS and k not in NOT_HEAD)
    return {"architecture": arch, "backbone": backbone, "neck": neck, "head": head or None}


def _registered():
    import ppdet.core.workspace as workspace

    return workspace, set(workspace.get_registered_modules())


def enumerate_tree(configs: Path) -> list[dict]:
    """One record per .yml under ``configs``: its path, signature and dataset name, or why it did not load."""
    from ppdet.core.config.schema import SchemaDict

    from ampsafe_lab.workloads.ppyolo import _clean_registry, _plain

    workspace, registered = _registered()
    out = []
    for path in sorted(configs.rglob("*.yml")):
        rel = str(path.relative_to(configs))
        record = {"config": rel}
        try:
            with _clean_registry(workspace, SchemaDict) as g:
                workspace.load_config(str(path))
                cfg = _plain(g, SchemaDict)
        except Exception as exc:  # a fragment whose _BASE_ is missing, a yaml tag of another tool
            record["load_error"] = _first_line(exc)
            out.append(record)
            continue
        if "architecture" not in cfg:
            record["fragment"] = True
        else:
            record.update(signature(cfg, registered))
            record["dataset"] = (
                (cfg.get("TrainDataset") or {}).get("name")
                if isinstance(cfg.get("TrainDataset"), dict)
                else type(cfg.get("TrainDataset")).__name__
            )
            record.update(recipe(cfg))
        out.append(record)
    return out


def _key_paths(node, want, prefix=()) -> list[list[str]]:
    """Every key path in ``node`` whose key/value ``want(key, value)`` accepts."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if want(key, value):
                out.append([*prefix, str(key)])
            out.extend(_key_paths(value, want, (*prefix, str(key))))
    return out


def _downloads_by_default(item, value) -> bool:
    """Whether the class loads weights when the config leaves ``pretrained`` unset: a non-empty default, or a
    ``None`` default that its constructor replaces (``if pretrained is None:``, Swin's and FocalNet's table)."""
    import inspect

    default = getattr(value, "default", None)
    if default:
        return True
    try:
        source = inspect.getsource(getattr(item.pymodule, item.name).__init__)
    except (AttributeError, OSError, TypeError):
        return False
    return default is None and "if pretrained is None" in source


def _default_pretrained(cfg: dict) -> list[list[str]]:
    """The classes the architecture names whose constructor's ``pretrained`` defaults to weights (Swin and
    FocalNet download them when the config leaves it unset): each gets ``pretrained: ''``."""
    import ppdet.core.workspace as workspace

    parts = cfg.get(cfg.get("architecture")) or {}
    out = []
    for value in parts.values():
        item = workspace.global_config.get(value) if isinstance(value, str) else None
        schema = getattr(item, "schema", {}) if item is not None else {}
        if "pretrained" in schema and _downloads_by_default(item, schema["pretrained"]):
            out.append([value, "pretrained"])
    return out


def frozen_norms(cfg: dict) -> list[list[str]]:
    """The classes the architecture names that freeze their BatchNorms (``freeze_norm`` true in the config or by
    default: ResNet's, HRNet's, Res2Net's...): each gets ``freeze_norm: false``. Why: a frozen BatchNorm normalizes
    with its stored statistics, which are the pretrained weights'; the sweep loads none, so they stay at their
    initial mean 0 and variance 1, every such BatchNorm is the identity, and nothing normalizes the backbone
    (a random ResNet-50's res5 then reaches ~4000 and RetinaNet's first loss ~7800)."""
    import ppdet.core.workspace as workspace

    parts = cfg.get(cfg.get("architecture")) or {}
    out = []
    for value in parts.values():
        item = workspace.global_config.get(value) if isinstance(value, str) else None
        schema = getattr(item, "schema", {}) if item is not None else {}
        if "freeze_norm" not in schema:
            continue
        section = cfg.get(value) if isinstance(cfg.get(value), dict) else {}
        if section.get("freeze_norm", getattr(schema["freeze_norm"], "default", None)) is True:
            out.append([value, "freeze_norm"])
    return out


def _plain_value(value):
    """``value`` if it is JSON data (a number, string, list or dict of them), else None."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None


def dataset_spec(dataset) -> dict | None:
    """The config's TrainDataset as ``{"name": class, "args": {...}}``: a ``name:`` mapping as written, a
    ``!Class`` object (dota.yml, the MOT and few-shot configs) by its constructor's arguments as the object holds
    them (``tagged``). Why: ppdet merges a mapping into a mapping only, and a ``!Class`` object of a ``_BASE_`` file
    lands in its global config in place of the registered ``TrainDataset`` schema (``_load_config_with_base``
    merges the first base into ``global_config`` itself), so the overlay must give the object again, as a
    ``!Class`` with its ``data_fields`` and the like."""
    import inspect

    if dataset is None:
        return None
    if isinstance(dataset, dict):
        args = {k: _plain_value(v) for k, v in dataset.items() if k != "name"}
        return {"name": dataset.get("name"), "args": {k: v for k, v in args.items() if v is not None}, "tagged": False}
    params = inspect.signature(type(dataset).__init__).parameters
    held = {**(getattr(dataset, "ann_info", None) or {}), **vars(dataset)}  # the keypoint classes: ann_info
    args = {}
    for key in params:
        if key in ("self", "transform") or key not in held:
            continue
        value = _plain_value(held[key])
        if value is not None:
            args[key] = value
    return {"name": type(dataset).__name__, "args": args, "tagged": True}


def _as_json(reader) -> dict | None:
    """A reader section of the merged config as plain JSON (objects by their ``str``), None when there is none."""
    return json.loads(json.dumps(reader, default=str)) if isinstance(reader, dict) else None


def recipe(cfg: dict) -> dict:
    """What the sweep's overlay needs from the merged config: the TrainReader (and a semi-supervised config's
    SemiTrainReader and UnsupTrainDataset), where ``sync_bn`` and ``pretrained`` weights are set (or default to a
    download), which classes freeze their norms, and the optimizer and base learning rate."""
    reader = cfg.get("TrainReader")
    semi = cfg.get("SemiTrainReader") if cfg.get("ssod_method") else None
    lr = cfg.get("LearningRate") or {}
    opt = (cfg.get("OptimizerBuilder") or {}).get("optimizer") or {}
    return {
        "train_reader": _as_json(reader),
        "sync_bn": _key_paths(cfg, lambda k, v: k == "norm_type" and v == "sync_bn"),
        "pretrained": _key_paths(
            {k: v for k, v in cfg.items() if isinstance(v, dict)}, lambda k, v: k == "pretrained" and bool(v)
        )
        + _default_pretrained(cfg),
        "frozen_norms": frozen_norms(cfg),
        "train_dataset": dataset_spec(cfg.get("TrainDataset")),
        # a semi-supervised config (ssod_method): its reader of labeled and unlabeled views, its unlabeled dataset
        "semi_train_reader": _as_json(semi),
        "unsup_train_dataset": dataset_spec(cfg.get("UnsupTrainDataset")) if semi else None,
        "num_classes": cfg.get("num_classes") if isinstance(cfg.get("num_classes"), int) else None,
        "lr": lr.get("base_lr") if isinstance(lr, dict) else None,
        "schedulers": [type(s).__name__ if not isinstance(s, dict) else s.get("name") for s in lr.get("schedulers", [])]
        if isinstance(lr, dict)
        else [],
        "optimizer": opt.get("type") if isinstance(opt, dict) else type(opt).__name__,
    }


def _neck_summary(report) -> dict:
    """The scan's paths that start in the model's ``neck``: how many, how many unnormalized, how many risky."""
    neck = [p for p in report.paths if p.start == "neck" or p.start.startswith("neck.")]
    return {
        "neck_paths": len(neck),
        "neck_unnormalized": sum(1 for p in neck if not p.normalized),
        "neck_risky": sum(1 for p in neck if p.risky),
    }


def _scan_summary(report, image_shape) -> dict:
    paths = [p for p in report.paths if p.headroom_bits is not None]
    least = min(paths, key=lambda p: p.headroom_bits, default=None)
    ops = [o for o in report.risky_ops if o.headroom_bits is not None]
    least_op = min(ops, key=lambda o: o.headroom_bits, default=None)
    return {
        "risky_paths": len(report.risky),
        "unnormalized_paths": sum(1 for p in report.paths if not p.normalized),
        "paths": len(report.paths),
        "least_headroom": None if least is None else round(float(least.headroom_bits), 2),
        "where": None if least is None else least.start,
        "risky_where": [p.start for p in report.risky][:8],
        "risky_ops": len(report.risky_ops),
        "risky_op_where": None if least_op is None else f"{least_op.module}:{least_op.op}",
        "input": "x".join(str(int(d)) for d in image_shape),
        **_neck_summary(report),
    }


def _raised_at(exc: BaseException) -> str | None:
    """``file:line: code`` of the innermost frame under ppdet/ where the model's own exception (the scan error's
    cause) was raised, or None."""
    cause = exc.__cause__ or exc.__context__ or exc
    frames = [f for f in traceback.extract_tb(cause.__traceback__) if "/ppdet/" in f.filename]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename[f.filename.index('ppdet/') :]}:{f.lineno}: {(f.line or '').strip()[:120]}"


def build_and_scan(overlay: Path) -> dict:
    """``load_config`` + ``create(cfg.architecture)`` as tools/train.py's Trainer does, one batch of the config's
    own TrainReader on the synthetic COCO data, then ``ampsafe.scan`` of the train-mode forward at O1 and O2."""
    import paddle

    import ampsafe

    paddle.set_device("cpu")
    paddle.seed(0)
    from ppdet.core.workspace import create, load_config

    result: dict = {"built": False, "why_not": None, "scan": None, "wall_s": {}}
    start = time.time()
    try:
        cfg = load_config(str(overlay))
        model = create(cfg.architecture)
        result["params"] = int(sum(math.prod(p.shape) for p in model.parameters()))
    except Exception as exc:
        result["why_not"] = "build: " + _first_line(exc)
        result["wall_s"]["build"] = round(time.time() - start, 1)
        return result
    result["built"] = True
    result["wall_s"]["build"] = round(time.time() - start, 1)
    if os.environ.get("AMPSAFE_ZOO_BUILD_ONLY"):
        result["why_not"] = "not scanned: " + os.environ["AMPSAFE_ZOO_BUILD_ONLY"]
        return result
    start = time.time()
    try:
        dataset = create("TrainDataset")()
        loader = create("TrainReader")(dataset, 0)
        batch = next(iter(loader))
        batch["epoch_id"] = 0  # as ppdet's Trainer adds to every batch (PP-YOLOE's head reads it)
    except Exception as exc:
        result["why_not"] = "reader: " + _first_line(exc)
        return result
    model.train()
    scans = {}
    for level in ("O1", "O2"):
        try:
            report = ampsafe.scan(model, (dict(batch),), level=level)
            scans[level] = _scan_summary(report, batch["image"].shape)
        except Exception as exc:
            scans[level] = {"error": _first_line(exc), "input": "x".join(str(int(d)) for d in batch["image"].shape)}
            if _raised_at(exc):
                scans[level]["raised_at"] = _raised_at(exc)
    result["scan"] = scans
    result["wall_s"]["scan"] = round(time.time() - start, 1)
    if os.environ.get("AMPSAFE_ZOO_KEEP_MODEL"):
        result["model"] = model
    return result


def one_record(configs: Path, name: str) -> dict:
    """One config's signature and recipe (what the sweep's overlay needs), as :func:`enumerate_tree` has it."""
    from ppdet.core.config.schema import SchemaDict

    from ampsafe_lab.workloads.ppyolo import _clean_registry, _plain

    workspace, registered = _registered()
    with _clean_registry(workspace, SchemaDict) as g:
        workspace.load_config(str(configs / name))
        cfg = _plain(g, SchemaDict)
    return {"config": name, **signature(cfg, registered), **recipe(cfg)}


def suite(configs: Path, out: Path, data: Path, size: int, names: list[str]) -> list[dict]:
    """For each config: its signature and recipe, the sweep's overlay at ``size``, build + scan, and the class
    of the built model's ``neck``; one process, ppdet's registry cleaned between configs (the CI subset)."""
    from ppdet.core.config.schema import SchemaDict

    from ampsafe_lab.workloads.ppyolo import _clean_registry
    from bench.zoo_ppdet import overlay

    workspace, _ = _registered()
    results = []
    for name in names:
        record = one_record(configs, name)
        path = overlay(record, data, out / name.replace("/", "__"), size=size, batch=1)
        with _clean_registry(workspace, SchemaDict):
            result = build_and_scan(path)
            model = result.pop("model", None)
        result.update(record, built_neck=type(getattr(model, "neck", None)).__name__)
        result.pop("train_reader", None)
        results.append(result)
    return results


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "enumerate":
        records = enumerate_tree(Path(argv[1]))
        Path(argv[2]).write_text(json.dumps(records, indent=1))
        return 0
    if what == "scan":
        try:
            result = build_and_scan(Path(argv[1]))
        except Exception as exc:
            result = {"built": None, "why_not": "worker: " + _first_line(exc), "trace": traceback.format_exc()[-2000:]}
        Path(argv[2]).write_text(json.dumps(result, indent=1))
        return 0
    if what == "record":
        configs, name, out = argv[1:]
        Path(out).write_text(json.dumps(one_record(Path(configs), name)))
        return 0
    if what == "records":  # many configs in one process: OUTDIR/<config with / as __>.json each
        configs, outdir, *names = argv[1:]
        for name in names:
            try:
                record = one_record(Path(configs), name)
            except Exception:  # noqa: BLE001 - a config that does not load again keeps no record
                continue
            path = Path(outdir) / (name.replace("/", "__").removesuffix(".yml") + ".json")
            path.write_text(json.dumps(record, default=str))
        return 0
    if what == "suite":
        os.environ["AMPSAFE_ZOO_KEEP_MODEL"] = "1"
        configs, out, data, size, *names = argv[1:]
        results = suite(Path(configs), Path(out), Path(data), int(size), names)
        (Path(out) / "suite.json").write_text(json.dumps(results, indent=1))
        return 0
    raise SystemExit(f"unknown command {what!r}: enumerate | scan | suite")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
