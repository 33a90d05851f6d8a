"""The PaddleDetection zoo: every config of the tree grouped by architecture signature, one config per signature
built by ppdet's own ``workspace.create``, scanned by ``ampsafe.scan`` at O1 and O2, and trained K steps by the
tree's own ``tools/train.py --amp`` with float16 emulated, natively and under ``ampsafe run --emulate-fp16``.

    python -m bench.zoo_ppdet --scan   [--until HH:MM]   # build + scan pass (appends rows, skips done ones)
    python -m bench.zoo_ppdet --train  [--until HH:MM]   # training pass (RT-DETR, PicoDet, YOLOX first)
    python -m bench.zoo_ppdet --scan --only CONFIG... [--scan-limit S]   # build + scan these configs again (rows replaced)
    python -m bench.zoo_ppdet --train --only CONFIG... [--redo] [--run-limit S]   # these rows, again; passes
                                                         # with disjoint --only lists can run side by side
    python -m bench.zoo_ppdet --fp32 CONFIG...           # the same rows' tools/train.py without --amp, 3 steps
    python -m bench.zoo_ppdet --render                   # bench/results/zoo-ppdet.md from the JSON
    python -m bench.zoo_ppdet --build-ext-op             # the tree's ppdet/ext_op for this CPU (rotated boxes)

The tree: ``$PPDET_SRC``, else ``shared/upstream/PaddleDetection-src`` (``$AMPSAFE_SHARED`` or beside the
checkout). Every child gets ``PYTHONPATH`` = the shim folder (:mod:`bench.zoo_ppdet_shim`), the tree, the
checkout and its lab, so the tree's ``ppdet`` wins over an installed one.

What each config runs on: an overlay ``_BASE_: [the config]`` that changes only what a CPU and synthetic data
need (``use_gpu: false``, ``norm_type: bn`` where the config says ``sync_bn``, no pretrained downloads and so
``freeze_norm: false`` where a class freezes its BatchNorms (their frozen statistics would be the initial mean 0 and
variance 1: identities, see ``bench.zoo_ppdet_worker.frozen_norms``), synthetic data in the format of the config's own
TrainDataset class (:mod:`bench.zoo_ppdet_data`; :func:`train_dataset`), ``worker_num: 0``, batch :data:`BATCH`) and
the config's own TrainReader transforms with their resize targets set to :data:`SIZE` (:func:`shrink`). Its
optimizer, learning rate and schedule (warm-up included) are the config's. A ``_base_`` model fragment with no
dataset borrows a config that names it in ``_BASE_`` (:func:`data_source`): the overlay's ``_BASE_`` is that config
then the fragment (its optimizer, epochs and runtime, the fragment's model), with that config's dataset, reader
and ``num_classes``. A semi-supervised config (``ssod_method``: ppdet's own trainers of labeled and unlabeled
batches) gets its SemiTrainReader shrunk likewise and an UnsupTrainDataset on the same synthetic images.
Every ppdet child runs in a :func:`~bench.zoo_ppdet_data.child_cwd` of the work folder, never in the tree.
The rotated-box heads import the tree's ``ext_op``: ``--build-ext-op`` builds it for this CPU into the work folder.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.zoo_ppdet_data import WRITERS, child_cwd, write_coco, write_dataset
from bench.zoo_ppdet_shim import LIMIT_EXIT, SHIM, STEPLOG_ENV, STOP_AT_ENV, STOP_ENV
from bench.zoo_ppdet_table import render

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "zoo-ppdet.json"
SIZE = 320  # the synthetic images and every resize target of the config's train transforms
BATCH = 2
K = 15  # training steps per run
SCAN_TIMEOUT = 240
TRAIN_TIMEOUT = 300
# the families PaddleX refuses AMP for and this sweep trains first, then the other families, in this order
FIRST = ("rtdetr", "picodet", "yolox")
FAMILY_ORDER = (
    *FIRST,
    "ppyoloe",
    "yolov3",
    "ppyolo",
    "fcos",
    "gfl",
    "tood",
    "centernet",
    "faster_rcnn",
    "cascade_rcnn",
    "mask_rcnn",
    "retinanet",
    "detr",
    "deformable_detr",
    "dino",
    "ttfnet",
    "solov2",
    "ssd",
    "yolof",
    "sparse_rcnn",
)
# config folders named after a backbone or a recipe, not an architecture: the family comes from the architecture
_ARCH_FAMILY = {
    "FasterRCNN": "faster_rcnn",
    "CascadeRCNN": "cascade_rcnn",
    "MaskRCNN": "mask_rcnn",
    "YOLOv3": "yolov3",
    "PPYOLOE": "ppyoloe",
    "DETR": "detr",
    "RetinaNet": "retinanet",
    "FCOS": "fcos",
    "GFL": "gfl",
}
_FAMILY_DIRS = {
    "ppyoloe", "rtdetr", "rtdetrv2", "picodet", "yolox", "yolov3", "ppyolo", "fcos", "gfl", "tood", "centernet",
    "faster_rcnn", "cascade_rcnn", "mask_rcnn", "retinanet", "detr", "deformable_detr", "dino", "group_detr",
    "ttfnet", "solov2", "ssd", "yolof", "sparse_rcnn", "queryinst", "mask_rtdetr", "keypoint", "mot", "pose3d",
    "face_detection", "rotate", "clrnet", "semi_det", "few-shot", "sqr", "ppyoloe_seg",
}  # fmt: skip
COCO_DATASETS = {"COCODataSet"}
# architectures whose train-mode forward computes no loss: built, not scanned, with this reason
NO_TRAIN_FORWARD = {
    "DeepSORT": (
        "DeepSORT has no training forward (ppdet's DeepSORT defines no get_loss, BaseArch's raises "
        "NotImplementedError; its _forward embeds inputs['crops'] with the ReID model): its detector and ReID "
        "train with their own configs"
    ),
}


def tree() -> Path:
    shared = Path(os.environ.get("AMPSAFE_SHARED", ROOT.parent / "shared"))
    return Path(os.environ.get("PPDET_SRC") or shared / "upstream" / "PaddleDetection-src")


def family(config: str, architecture: str | None) -> str:
    top = config.split("/", 1)[0]
    if top in _FAMILY_DIRS:
        return top
    return _ARCH_FAMILY.get(architecture or "", (architecture or top).lower())


# ``import ext_op`` for the rotated-box heads (PP-YOLOE-R, FCOSR, S2ANet): the tree's ppdet/ext_op C++ sources,
# built for this CPU by Paddle's own JIT loader into the work folder (``--build-ext-op``); nothing is installed
EXT_OP = """\"\"\"Written by bench/zoo_ppdet.py: the tree's ppdet/ext_op built (once) and loaded by paddle's cpp_extension.\"\"\"
import glob
import os

from paddle.utils.cpp_extension import load

_csrc = os.path.join({tree!r}, "ppdet", "ext_op", "csrc")
_build = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build")
os.makedirs(_build, exist_ok=True)
globals().update(vars(load("ext_op", sorted(glob.glob(os.path.join(_csrc, "*", "*.cc"))), build_directory=_build)))
"""


def ext_op_dir(work: Path) -> Path:
    return work / "ext_op"


def build_ext_op(work: Path) -> None:
    """Write the ``ext_op`` loader module and build the op once (a child imports it); the children of later passes
    find it on their ``PYTHONPATH``."""
    folder = ext_op_dir(work)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ext_op.py").write_text(EXT_OP.format(tree=str(tree())), encoding="utf-8")
    code = "import ext_op; print('ext_op:', sorted(k for k in vars(ext_op) if not k.startswith('_')))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env(work), cwd=folder, capture_output=True, text=True, timeout=1800
    )
    print(proc.stdout.strip() or proc.stderr.strip()[-2000:], flush=True)


def child_env(work: Path) -> dict:
    shim = work / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM, encoding="utf-8")
    env = dict(os.environ)
    parts = [str(shim), str(tree()), str(ROOT), str(ROOT / "lab")]
    if (ext_op_dir(work) / "ext_op.py").is_file():
        parts.insert(1, str(ext_op_dir(work)))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop(STEPLOG_ENV, None)
    env.pop(STOP_ENV, None)
    return env


# --------------------------------------------------------------------------------------------- data and overlay


def _target(value, size: int):
    """A resize target of the same form at ``size``: int, [h, w] or a list of them."""
    if isinstance(value, (int, float)):
        return size
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [[size, size]]
    if isinstance(value, list) and len(value) == 2:
        return [size, size]
    return [size]


def _is_transform(item) -> bool:
    """Whether ``item`` is a reader transform as a config writes it: ``{ClassName: {arguments} or None}``."""
    if not (isinstance(item, dict) and len(item) == 1):
        return False
    ((name, args),) = item.items()
    return isinstance(name, str) and name[:1].isupper() and isinstance(args, (dict, type(None)))


def shrink(op: dict, size: int = SIZE) -> dict:
    """One transform of the config's TrainReader with its resize targets at ``size`` (other arguments kept), the
    transforms it nests too (RandomSelect's ``transforms1`` / ``transforms2``, StrongAugImage's ``transforms``)."""
    ((name, args),) = op.items()
    args = dict(args or {})
    for key, value in args.items():
        if isinstance(value, list) and value and all(_is_transform(v) for v in value):
            args[key] = [shrink(v, size) for v in value]
    if name in ("BatchRandomResize", "BatchRandomResizeForSSOD"):
        args["target_size"] = [size]
    elif "target_size" in args:
        args["target_size"] = _target(args["target_size"], size)
    if "input_dim" in args:
        args["input_dim"] = [size, size]
    if name == "RandomShortSideResize":
        args["short_side_sizes"] = [size]
        args["max_size"] = size
    if name == "RandomSizeCrop":
        args["min_size"] = min(int(args.get("min_size", size // 2)), size // 2)
        args["max_size"] = min(int(args.get("max_size", size)), size)
    if name == "Pad" and isinstance(args.get("size"), list):
        args["size"] = [size, size]
    return {name: args}


def _nested(path: list[str], value) -> dict:
    out: dict = {}
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


def _merge(into: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


# the TrainDataset keys that name where a class reads its files: the overlay's writer sets them, the rest of the
# config's own dataset arguments (data_fields, num_joints, trainsize, cut_height...) are kept
_DATA_PATH_KEYS = {"dataset_dir", "image_dir", "anno_path", "image_lists", "list_path", "anno_list", "image_dirs",
                   "label_list", "bbox_file"}  # fmt: skip


def train_dataset(record: dict, data: Path, size: int = SIZE, spec: dict | None = None) -> dict:
    """The overlay's TrainDataset (or ``spec``'s: a semi-supervised config's UnsupTrainDataset): the config's own
    class and arguments, pointed at that class's synthetic files (bench.zoo_ppdet_data writes them beside the COCO
    folder ``data``); a :class:`Tagged` object where the config gives a ``!Class`` object (see
    ``bench.zoo_ppdet_worker.dataset_spec``). A class with no writer keeps the COCO keys (its row is built, not
    scanned)."""
    spec = spec or record.get("train_dataset") or {"name": record.get("dataset"), "args": {}}
    if spec.get("name") not in WRITERS:
        return {"dataset_dir": str(data), "image_dir": "images", "anno_path": "train.json"}
    args = {k: v for k, v in (spec.get("args") or {}).items() if k not in _DATA_PATH_KEYS}
    fields = write_dataset(
        spec["name"], data, K * BATCH, size, args=spec.get("args"), classes=record.get("num_classes")
    )
    if spec.get("tagged"):
        return Tagged(spec["name"], {**args, **fields})
    return {"name": spec["name"], **args, **fields}


class Tagged(dict):
    """A mapping the overlay writes as a ``!Name`` YAML object (ppdet constructs ``Name(**mapping)`` on load)."""

    def __init__(self, tag: str, mapping: dict):
        super().__init__(mapping)
        self.tag = tag


def _dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(Tagged, lambda d, t: d.represent_mapping("!" + t.tag, dict(t)))
    return Dumper


# a reader's transform lists (a SemiTrainReader's: its sample transforms, then weak and strong views of each image,
# then the labeled and the unlabeled batch's)
_TRANSFORMS = ("sample_transforms", "batch_transforms", "weak_aug", "strong_aug", "sup_batch_transforms",
               "unsup_batch_transforms")  # fmt: skip


def _reader(reader: dict | None, size: int, **batch_sizes: int) -> dict:
    """The config's reader with every resize target at ``size`` (:func:`shrink`), ``batch_sizes`` set, in order,
    one process and no shared memory."""
    out = dict(reader or {})
    for key in _TRANSFORMS:
        if key in out:
            out[key] = [shrink(op, size) for op in out[key]]
    out.update(**batch_sizes, shuffle=False, drop_last=True, use_shared_memory=False)
    return out


def labeled_view(semi: dict | None) -> dict | None:
    """A semi-supervised config's SemiTrainReader as the TrainReader of its labeled batches (sample transforms,
    then the weak view's, then the labeled batch's), for a config with no TrainReader of its own (ARSL's): what the
    scan pass runs the config's model on."""
    if not semi:
        return None
    return {
        "sample_transforms": [*semi.get("sample_transforms", []), *semi.get("weak_aug", [])],
        "batch_transforms": list(semi.get("sup_batch_transforms", [])),
    }


def overlay(record: dict, data: Path, out: Path, *, size: int = SIZE, batch: int = BATCH) -> Path:
    """The user's overlay over the upstream config (see the module docstring); returns its path."""
    import yaml

    reader = _reader(
        record.get("train_reader") or labeled_view(record.get("semi_train_reader")), size, batch_size=batch
    )
    body: dict = {
        # a fragment after the config it borrows from: that config's optimizer, epochs and runtime, the fragment's model
        "_BASE_": [str(tree() / "configs" / c) for c in (record.get("data_from"), record["config"]) if c],
        "use_gpu": False,
        "log_iter": 1,
        "snapshot_epoch": 100000,
        "worker_num": 0,
        "pretrain_weights": "",
        "save_dir": str(out / "output"),
        "TrainDataset": train_dataset(record, data, size),
        "TrainReader": reader,
    }
    if record.get("semi_train_reader"):  # ssod_method: ppdet's semi-supervised trainers read these two instead
        body["SemiTrainReader"] = _reader(
            record["semi_train_reader"], size, sup_batch_size=batch, unsup_batch_size=batch
        )
        body["UnsupTrainDataset"] = train_dataset(record, data, size, record.get("unsup_train_dataset"))
        body["pretrain_student_weights"] = body["pretrain_teacher_weights"] = ""
    if record.get("data_from") and record.get("num_classes"):  # the borrowed dataset's class count (JDE's loss)
        body["num_classes"] = record["num_classes"]
    for path in record.get("sync_bn") or []:
        _merge(body, _nested(path, "bn"))
    for path in record.get("pretrained") or []:
        _merge(body, _nested(path, ""))
    for path in record.get("frozen_norms") or []:  # no pretrained statistics to freeze: see the module doc
        _merge(body, _nested(path, False))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "overlay.yml"
    path.write_text(yaml.dump(body, Dumper=_dumper(), sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- the JSON


def machine() -> dict:
    """bench.common's machine record, with the checkout's commit, the tree and the threads each run used."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        **common.machine(),
        "git commit": commit.stdout.strip(),
        "ppdet tree": "PaddlePaddle/PaddleDetection 666f597f (2024-10)",
        "threads": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def load() -> dict:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"machine": machine(), "K": K, "size": SIZE, "batch": BATCH, "rows": [], "signatures": []}


def save(doc: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    tmp.replace(RESULTS)


def save_row(row: dict) -> None:
    """Write one row into the results file as it is on disk now, under a lock: two training passes (``--only``
    with disjoint configs) can then run side by side without one's save dropping the other's rows."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = load()
        rows = doc["rows"]
        at = next((i for i, r in enumerate(rows) if r["config"] == row["config"]), None)
        if at is None:
            rows.append(row)
        else:
            rows[at] = row
        save(doc)


def enumerate_signatures(work: Path) -> list[dict]:
    out = work / "enumerate.json"
    if not out.is_file():
        subprocess.run(
            [sys.executable, "-m", "bench.zoo_ppdet_worker", "enumerate", str(tree() / "configs"), str(out)],
            env=child_env(work), cwd=child_cwd(work / "cwd"), capture_output=True, text=True, check=True, timeout=900,
        )  # fmt: skip
    return json.loads(out.read_text())


def _record_path(work: Path, config: str) -> Path:
    return work / "records" / (config.replace("/", "__").removesuffix(".yml") + ".json")


def prefetch(configs: list[str], work: Path) -> None:
    """The worker's records (signature and recipe) of ``configs`` not cached under ``work/records`` yet, read in one
    child (ppdet imported once)."""
    missing = [c for c in configs if _cached(work, c) is None]
    if not missing:
        return
    (work / "records").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "records", str(tree() / "configs"), str(work / "records")]
    subprocess.run(
        [*cmd, *missing],
        env=child_env(work),
        cwd=child_cwd(work / "cwd"),
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _cached(work: Path, config: str) -> dict | None:
    """The worker's cached record of ``config``, if it has every recipe key (``num_classes`` is the newest)."""
    path = _record_path(work, config)
    record = json.loads(path.read_text()) if path.is_file() else {}
    return record if "num_classes" in record else None


def complete(record: dict, work: Path) -> dict:
    """``record`` with the recipe keys an enumeration cached before they existed lacks (``frozen_norms``,
    ``train_dataset``), from the worker's record of that config. A config the worker cannot read again keeps its
    norms as configured (its build says why, if it fails)."""
    if "frozen_norms" in record and "train_dataset" in record and "num_classes" in record:
        return record
    prefetch([record["config"]], work)
    path = _record_path(work, record["config"])
    fresh = json.loads(path.read_text()) if path.is_file() else {}
    if "frozen_norms" not in record:
        record["frozen_norms"] = fresh.get("frozen_norms") or []
    record.setdefault("train_dataset", fresh.get("train_dataset"))
    record.setdefault("num_classes", fresh.get("num_classes"))
    return record


def _bases(config: Path) -> list[Path]:
    """The files ``config``'s ``_BASE_`` names (read as plain YAML: ppdet's ``!Class`` tags become None)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        doc = yaml.load(config.read_text(encoding="utf-8"), Loader=Loader) or {}
    except yaml.YAMLError:
        return []
    bases = doc.get("_BASE_") if isinstance(doc, dict) else None
    return [(config.parent / b).resolve() for b in bases or [] if isinstance(b, str)]


def data_source(record: dict, records: dict[str, dict], doc: dict) -> tuple[str | None, str | None]:
    """For a config with no TrainDataset or TrainReader of its own (a ``_base_`` model fragment): the top-level
    config whose data and reader its scan borrows, or why none. The smallest config whose ``_BASE_`` names the
    fragment; if those all fail to load, none (their load error is the reason); if no config names it, the
    family's first scanned row (the family's real configs train on that dataset and reader)."""
    configs = tree() / "configs"
    me = (configs / record["config"]).resolve()
    users = [r for r in records.values() if me in _bases(configs / r["config"])]
    usable = [r for r in users if r.get("train_reader") and r.get("dataset") not in (None, "NoneType")]
    if usable:
        return min(usable, key=_pick_key)["config"], None
    failed = [r for r in users if r.get("load_error")]
    if failed:
        names = ", ".join(r["config"] for r in failed)
        return None, f"a _base_ fragment; the configs that name it in _BASE_ ({names}) do not load: " + failed[0][
            "load_error"
        ]
    mine = family(record["config"], record.get("architecture"))
    scanned = [r["config"] for r in doc["rows"] if r.get("scan") and r["family"] == mine]
    if scanned:
        return scanned[0], None
    return (
        None,
        "a _base_ fragment with no TrainDataset, that no config names in _BASE_ and whose family has no scanned row",
    )


def with_data(record: dict, records: dict[str, dict], doc: dict, work: Path) -> dict:
    """``record`` itself when it has a dataset, else (a ``_base_`` fragment) a copy whose ``dataset``,
    ``train_dataset``, ``train_reader`` and ``num_classes`` are those of :func:`data_source`'s config, named in
    ``data_from``."""
    if record.get("dataset") not in (None, "NoneType"):
        return record
    source, why = data_source(record, records, doc)
    if source is None:
        return {**record, "no_data": why}
    src = complete(dict(records[source]), work)
    keys = ("dataset", "train_dataset", "train_reader", "num_classes")
    return {**record, **{k: src.get(k) for k in keys}, "data_from": source}


def mark_frozen(doc: dict, work: Path) -> None:
    """Rows scanned before the overlay unfroze the norms: ``frozen_at_init`` names the classes whose BatchNorms
    ran frozen at their initial statistics (identities) in that scan (and in a training run without
    ``unfrozen_norms``)."""
    old = [r for r in doc["rows"] if "unfrozen_norms" not in r and "frozen_at_init" not in r]
    prefetch([r["config"] for r in old], work)
    for row in old:
        path = _record_path(work, row["config"])
        if path.is_file():
            row["frozen_at_init"] = [".".join(p) for p in json.loads(path.read_text()).get("frozen_norms") or []]


# model-size words in config names, smallest first: a signature is run on its smallest variant (CPU time)
_SIZES = {"nano": 0, "tiny": 1, "xs": 1, "t": 2, "s": 3, "r18vd": 3, "r18": 3, "m": 4, "l": 5, "x": 6, "h": 7}


def _pick_key(record: dict):
    """Which config stands for its signature: a COCO one, then the smallest model (by the size word of its
    name), then one named for COCO, then the shortest name."""
    name = record["config"]
    words = Path(name).stem.split("_")
    size = min((_SIZES[w] for w in words if w in _SIZES), default=4)
    return (record.get("dataset") not in COCO_DATASETS, size, "coco" not in name, len(name), name)


def signatures(records: list[dict]) -> list[dict]:
    """One entry per signature: its members and the chosen config; fragments and load errors as their own."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "architecture" in r:
            key = (r["architecture"], r["backbone"], r["neck"], r["head"])
            groups.setdefault(key, []).append(r)
    out = []
    for key, members in groups.items():
        chosen = min(members, key=_pick_key)
        out.append(
            {
                "signature": list(key),
                "family": family(chosen["config"], key[0]),
                "count": len(members),
                "configs": sorted(m["config"] for m in members),
                "chosen": chosen["config"],
            }
        )
    order = {f: i for i, f in enumerate(FAMILY_ORDER)}
    out.sort(key=lambda s: (order.get(s["family"], len(order)), -s["count"], s["chosen"]))
    # scan order: every signature of RT-DETR, PicoDet, YOLOX; then each family's largest; then the rest
    leaders = {}
    for s in out:
        leaders.setdefault(s["family"], s["chosen"])

    def tier(s):
        return 0 if s["family"] in FIRST else 1 if leaders[s["family"]] == s["chosen"] else 2

    return sorted(out, key=tier)


def _row_for(record: dict) -> dict:
    return {
        "tree": "PaddleDetection",
        "config": record["config"],
        "family": family(record["config"], record.get("architecture")),
        "architecture": record.get("architecture"),
        "backbone": record.get("backbone"),
        "neck": record.get("neck"),
        "head": record.get("head"),
        "built": None,
        "why_not": None,
        "scan": None,
        "train": None,
        "lr": record.get("lr"),
        "optimizer": record.get("optimizer"),
        "schedulers": record.get("schedulers"),
        "wall_s": {},
    }


# --------------------------------------------------------------------------------------------- the passes


def _past(until: str | None) -> bool:
    stop = common.deadline(until)
    return stop is not None and time.time() >= stop


def not_scanned(record: dict) -> str | None:
    """Why the scan pass builds ``record``'s model but does not scan it, or None when it scans it."""
    arch, dataset = record.get("architecture"), record.get("dataset")
    if arch in NO_TRAIN_FORWARD:
        return NO_TRAIN_FORWARD[arch]
    if dataset in (None, "NoneType"):
        return record.get("no_data") or "no TrainDataset"
    if dataset not in WRITERS:
        return f"TrainDataset is {dataset}: the sweep writes no data of that class"
    return None


def scan_one(record: dict, work: Path, data: Path, scan_limit: float = SCAN_TIMEOUT) -> dict:
    record = complete(record, work)
    row = _row_for(record)
    row["unfrozen_norms"] = [".".join(p) for p in record["frozen_norms"]]
    if record.get("data_from"):
        row["data_from"] = record["data_from"]
    out = work / record["config"].replace("/", "__").removesuffix(".yml")
    path = overlay(record, data, out)
    result_file = out / "scan.json"
    start = time.time()
    env = child_env(work)
    reason = not_scanned(record)
    if reason:
        env["AMPSAFE_ZOO_BUILD_ONLY"] = reason
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "scan", str(path), str(result_file)]
    code, log = run_group(cmd, timeout=scan_limit, env=env, cwd=child_cwd(out))
    (out / "scan.log").write_text(log)
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    if result is None and code == 124:
        result = {"built": None, "why_not": f"build + scan over {scan_limit:.0f} s on this CPU (not scanned)"}
    elif result is None:
        tail = [ln for ln in log.strip().splitlines() if ln.strip()]
        result = {"built": None, "why_not": f"worker exit {code}: " + (tail[-1][:300] if tail else "")}
    row.update({k: result.get(k) for k in ("built", "why_not", "scan", "params")})
    errors = [s.get("error") for s in (row["scan"] or {}).values()]
    if errors and all(errors) and not row["why_not"]:  # the model's own forward raised at every level
        at = row["scan"]["O1"].get("raised_at")
        row["why_not"] = "scan: " + errors[0] + (f" (raised at {at})" if at else "")
    row["wall_s"] = {**(result.get("wall_s") or {}), "build+scan total": round(time.time() - start, 1)}
    return row


def run_scan(
    doc: dict, work: Path, until: str | None, only: list[str] | None = None, scan_limit: float = SCAN_TIMEOUT
) -> None:
    """Build and scan every signature's chosen config that has no row yet; with ``only``, those configs again
    (their rows replaced, a parallel pass's rows kept)."""
    records = {r["config"]: r for r in enumerate_signatures(work)}
    if only:
        unknown = [c for c in only if c not in records]
        if unknown:
            raise SystemExit(f"--only names configs the enumeration does not have: {unknown}")
        prefetch(only, work)
        data = write_coco(work / "coco", K * BATCH)
        for config in only:
            if _past(until):
                print(f"scan: stopped at {until} UTC", flush=True)
                return
            row = scan_one(with_data(records[config], records, doc, work), work, data, scan_limit)
            save_row(row)
            print(f"scan: {row['config']} built={row['built']} {row['why_not'] or ''} {row['wall_s']}", flush=True)
        return
    doc["signatures"] = signatures(list(records.values()))
    doc["fragments"] = sorted(r["config"] for r in records.values() if r.get("fragment"))
    doc["load_errors"] = {r["config"]: r["load_error"] for r in records.values() if "load_error" in r}
    save(doc)
    prefetch([s["chosen"] for s in doc["signatures"]], work)
    mark_frozen(doc, work)
    save(doc)
    data = write_coco(work / "coco", K * BATCH)
    done = {r["config"] for r in doc["rows"]}
    for sig in doc["signatures"]:
        if sig["chosen"] in done:
            continue
        if _past(until):
            print(f"scan: stopped at {until} UTC", flush=True)
            return
        row = scan_one(with_data(records[sig["chosen"]], records, doc, work), work, data, scan_limit)
        doc["rows"].append(row)
        save(doc)
        print(f"scan: {row['config']} built={row['built']} {row['why_not'] or ''} {row['wall_s']}", flush=True)


NATIVE = (
    "import sys, runpy; import ppdet.engine; "
    "from ampsafe.paddle import amp_emulation; amp_emulation.install(); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def train_command(run: str, config: Path, report: Path) -> list[str]:
    """The tree's ``tools/train.py --amp`` on ``config``, natively (float16 emulated, Paddle's own scaler) or under
    ``ampsafe run --emulate-fp16``; it runs in a :func:`child_cwd`, not in the tree."""
    script = str(tree() / "tools" / "train.py")
    args = ["-c", str(config), "--amp", "--enable_ce", "True"]  # enable_ce: tools/train.py seeds 0
    if run == "native":
        return [sys.executable, "-c", NATIVE, script, *args]
    return [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--report", str(report), "--",
            sys.executable, script, *args]  # fmt: skip


STOP_GRACE_S = 60  # after the Ctrl-C at a run's limit: time for ampsafe run to write its report
STEP_GRACE_S = 300  # past a training run's limit: the step under way ends and the run stops (the shim's STOP_AT)


def run_group(cmd: list[str], *, timeout: float, **kwargs) -> tuple[int, str]:
    """Run ``cmd`` in its own process group. At ``timeout`` the group gets SIGINT, as a user's Ctrl-C (``ampsafe
    run`` writes its report when the command ends within :data:`STOP_GRACE_S`); whatever still runs then is
    killed. A training run stops itself between steps at its limit (the shim's ``STOP_AT``): this is its
    backstop."""
    import signal

    def sigint_default() -> None:  # a sweep started in the background (nohup, &) has SIGINT ignored: its children too
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_default,
        **kwargs,
    )
    try:
        log, _ = proc.communicate(timeout=timeout)
        return proc.returncode, log
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            log, _ = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
        return LIMIT_EXIT, (log or "") + f"\ntimeout after {timeout} s on this CPU"


def _steps(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(x) -> bool:
    return x is not None and x == x and abs(x) != float("inf")


def summarize_run(lines: list[dict], report: dict | None, returncode: int, log: str) -> dict:
    """overflowing steps, final scale, first/last loss, finite; for ampsafe's runs the scale, overflows and heals
    from report.json (its scaler's own records), for the native runs from Paddle's scaler (the shim's lines)."""
    losses = [s.get("loss") for s in lines if s.get("kind") == "stats"]
    scaler = [s for s in lines if s.get("kind") == "scaler" and s.get("enabled", True)]
    out = {
        "steps_run": len(losses),
        "overflow_steps": [s["step"] for s in scaler if s.get("found_inf")],
        "final_scale": scaler[-1]["scale"] if scaler else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "finite": bool(losses) and all(_finite(v) for v in losses),
        "losses": losses,
        "scaler": scaler[-1]["class"] if scaler else None,
        "returncode": returncode,
    }
    if returncode == LIMIT_EXIT:
        out["error"] = "stopped by the sweep's run limit"
    elif returncode:
        text = [ln for ln in log.strip().splitlines() if ln.strip()]
        out["error"] = next((ln for ln in reversed(text) if "Error" in ln), text[-1] if text else "")[:300]
    if report is not None:
        stepped = [s for s in report.get("scalers", []) if s.get("total_steps")]
        out["heals"] = []
        if stepped:
            s = stepped[0]
            out["scaler"] = s.get("class")
            out["overflow_steps"] = [r[0] for r in s.get("steps", []) if r[2]]
            out["final_scale"] = s.get("scale")
            out["heals"] = [
                {"step": h.get("step"), "islanded": list(h.get("paths", []))} for h in s.get("heal_records", [])
            ]
            out["floor_hits"] = s.get("floor_hits")
            out["overflow_origins"] = [
                {k: o.get(k) for k in ("step", "module", "kind")} for o in s.get("overflow_origins", [])
            ][:5]
    return out


def train_one(row: dict, record: dict, work: Path, data: Path, run_limit: float = TRAIN_TIMEOUT) -> dict:
    out = work / row["config"].replace("/", "__").removesuffix(".yml")
    record = complete(record, work)
    config = overlay(record, data, out)
    train = {"steps": K, "lr": row.get("lr"), "optimizer": row.get("optimizer"), "schedulers": row.get("schedulers")}
    train["unfrozen_norms"] = [".".join(p) for p in record["frozen_norms"]]
    for run in ("native", "ampsafe"):
        folder = out / run
        folder.mkdir(parents=True, exist_ok=True)
        steplog = folder / "steps.jsonl"
        steplog.unlink(missing_ok=True)
        report = folder / "report"
        shutil.rmtree(report, ignore_errors=True)  # a report.json left by an earlier run is not this run's
        env = child_env(work)
        start = time.time()
        env[STEPLOG_ENV], env[STOP_ENV], env[STOP_AT_ENV] = str(steplog), str(K), str(start + run_limit)
        cmd = train_command(run, config, report)
        code, log = run_group(cmd, timeout=run_limit + STEP_GRACE_S, env=env, cwd=child_cwd(folder))
        (folder / "log.txt").write_text(log)
        seconds = round(time.time() - start, 1)
        rep = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else None
        train[run] = summarize_run(_steps(steplog), rep if run == "ampsafe" else None, code, log)
        if run == "ampsafe" and rep is None:  # its overflows and scale are in the report only: unknown here
            train[run]["overflow_steps"] = None
        row["wall_s"][run] = seconds
        print(f"train: {row['config']} {run} {seconds}s {json.dumps(train[run])[:400]}", flush=True)
    return train


def _train_order(doc: dict) -> list[dict]:
    """The built rows with a scan, in this order: the smallest model of RT-DETR, PicoDet and YOLOX (each family
    without a trained row); the smallest of every other family (those whose scan flags a risky path first, least
    O1 headroom first); the other RT-DETR / PicoDet / YOLOX signatures; the other rows whose scan flags a risky
    path; the rest."""
    rows = [r for r in doc["rows"] if r.get("built") and r.get("scan") and not r.get("train")]
    trained = {r["family"] for r in doc["rows"] if r.get("train")}
    smallest: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r.get("params") or 0):
        if r["family"] not in trained:  # a family with a trained row has its leader
            smallest.setdefault(r["family"], r)
    leaders = [smallest[f] for f in FIRST if f in smallest]

    def risky(r):
        return any((r["scan"].get(lvl) or {}).get("risky_paths") for lvl in ("O1", "O2"))

    def o1_headroom(r):
        least = (r["scan"].get("O1") or {}).get("least_headroom")
        return least if least is not None else float("inf")

    # the other families' leaders: those whose scan flags a risky path first, least O1 headroom first
    per_family = [r for r in rows if smallest.get(r["family"]) is r and r not in leaders]
    per_family.sort(key=lambda r: (not risky(r), o1_headroom(r) if risky(r) else 0))
    more_first = [r for r in rows if r["family"] in FIRST and r not in leaders]

    placed = leaders + per_family + more_first
    flagged = [r for r in rows if r not in placed and risky(r)]
    rest = [r for r in rows if r not in placed and r not in flagged]
    return placed + flagged + rest


def run_train(
    doc: dict,
    work: Path,
    until: str | None,
    only: list[str] | None,
    redo: bool = False,
    run_limit: float = TRAIN_TIMEOUT,
    scan_limit: float = SCAN_TIMEOUT,
) -> None:
    """Train the rows in :func:`_train_order` (or ``only`` those, in the order given). ``redo`` retrains rows that
    have a training already, and first scans again a row scanned before the overlay unfroze the norms."""
    records = {r["config"]: r for r in enumerate_signatures(work)}
    data = write_coco(work / "coco", K * BATCH)
    if only:
        by_config = {r["config"]: r for r in doc["rows"]}
        unknown = [c for c in only if c not in by_config]
        if unknown:
            raise SystemExit(f"--only names configs with no scanned row: {unknown}; run --scan first")
        order = [by_config[c] for c in only if redo or not by_config[c].get("train")]
    else:
        order = _train_order(doc)
    for row in order:
        if _past(until):
            print(f"train: stopped at {until} UTC", flush=True)
            return
        if redo and row.get("frozen_at_init"):
            row = scan_one(with_data(records[row["config"]], records, doc, work), work, data, scan_limit)
            print(f"scan: {row['config']} again with the norms unfrozen {row['wall_s']}", flush=True)
            if not row.get("scan"):
                save_row(row)
                continue
        record = with_data(records[row["config"]], records, doc, work)
        row["train"] = train_one(row, record, work, data, run_limit)
        save_row(row)


def resummarize(doc: dict, work: Path) -> None:
    """Rebuild the trained rows' run summaries from their folders (steps.jsonl, report.json, log.txt) under
    ``work``, so that a field added to :func:`summarize_run` reaches rows trained before it."""
    for row in doc["rows"]:
        out = work / row["config"].replace("/", "__").removesuffix(".yml")
        for run in ("native", "ampsafe"):
            folder = out / run
            if not row.get("train") or not (folder / "log.txt").is_file():
                continue
            old = row["train"].get(run) or {}
            rep = folder / "report" / "report.json"
            report = json.loads(rep.read_text()) if run == "ampsafe" and rep.is_file() else None
            log = (folder / "log.txt").read_text()
            row["train"][run] = summarize_run(_steps(folder / "steps.jsonl"), report, old.get("returncode", 0), log)
    save(doc)


FP32_STEPS = 3


def fp32_check(work: Path, config: str, steps: int = FP32_STEPS, run_limit: float = TRAIN_TIMEOUT) -> None:
    """``tools/train.py`` without ``--amp`` (float32) for ``steps`` steps on the row's overlay: whether a
    run that fails under float16 trains in float32 on the same data and seed. Stored as the row's ``fp32``."""
    doc = load()  # as saved: a parallel pass may have trained the row
    row = next(r for r in doc["rows"] if r["config"] == config)
    records = {r["config"]: r for r in enumerate_signatures(work)}
    data = write_coco(work / "coco", K * BATCH)
    out = work / config.replace("/", "__").removesuffix(".yml")
    path = overlay(complete(with_data(records[config], records, doc, work), work), data, out)
    steplog = out / "fp32" / "steps.jsonl"
    steplog.parent.mkdir(parents=True, exist_ok=True)
    steplog.unlink(missing_ok=True)
    env = child_env(work)
    env[STEPLOG_ENV], env[STOP_ENV] = str(steplog), str(steps)
    start = time.time()
    cmd = [sys.executable, str(tree() / "tools" / "train.py"), "-c", str(path), "--enable_ce", "True"]
    code, log = run_group(cmd, timeout=run_limit, env=env, cwd=child_cwd(steplog.parent))
    (steplog.parent / "log.txt").write_text(log)
    run = summarize_run(_steps(steplog), None, code, log)
    run["losses"] = [s.get("loss") for s in _steps(steplog) if s.get("kind") == "stats"]
    row["fp32"] = run
    row["wall_s"]["fp32"] = round(time.time() - start, 1)
    save_row(row)
    print(f"fp32: {config} {json.dumps(run)[:400]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--until", default=None, help="HH:MM UTC: start no new config after it")
    parser.add_argument(
        "--only", nargs="*", default=None, help="scan / train only these configs (relative to configs/)"
    )
    parser.add_argument("--redo", action="store_true", help="with --only: train again (and scan again if frozen)")
    parser.add_argument("--run-limit", type=float, default=TRAIN_TIMEOUT, help="seconds per training run")
    parser.add_argument("--scan-limit", type=float, default=SCAN_TIMEOUT, help="seconds per config's build + scan")
    parser.add_argument("--fp32", nargs="*", default=[], help="float32 check of these configs (no --amp)")
    parser.add_argument("--fp32-steps", type=int, default=FP32_STEPS, help="steps of the float32 check")
    parser.add_argument("--resummarize", action="store_true", help="rebuild the run summaries from the run folders")
    parser.add_argument("--build-ext-op", action="store_true", help="build the tree's ppdet/ext_op for this CPU")
    parser.add_argument("--work", default="/tmp/ampsafe-zoo-ppdet")
    args = parser.parse_args(argv)
    if not (tree() / "tools" / "train.py").is_file():
        raise SystemExit(f"needs the PaddleDetection source tree at {tree()}: set PPDET_SRC or AMPSAFE_SHARED")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    doc = load()
    start = time.time()
    if args.build_ext_op:
        build_ext_op(work)
    if args.scan:
        run_scan(doc, work, args.until, args.only, args.scan_limit)
        doc = load()  # the rows as saved (--only saves row by row)
    if args.train:
        run_train(doc, work, args.until, args.only, args.redo, args.run_limit, args.scan_limit)
    for config in args.fp32:
        fp32_check(work, config, args.fp32_steps, args.run_limit)
    if args.resummarize:
        resummarize(doc, work)
    if args.train:
        doc = load()  # the rows as saved, a parallel pass's included
    if args.scan or args.train:
        doc["wall_s_total"] = round(doc.get("wall_s_total", 0) + time.time() - start, 1)
        doc["machine"]["date"] = machine()["date"]
        save(doc)
    if args.render:
        path = RESULTS.with_suffix(".md")
        path.write_text(render(doc), encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
