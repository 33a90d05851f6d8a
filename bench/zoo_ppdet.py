"""The PaddleDetection zoo: every config of the tree grouped by architecture signature, one config per signature
built by ppdet's own ``workspace.create``, scanned by ``ampsafe.scan`` at O1 and O2, and trained K steps by the
tree's own ``tools/train.py --amp`` with float16 emulated, natively and under ``ampsafe run --emulate-fp16``.

    python -m bench.zoo_ppdet --scan   [--until HH:MM]   # build + scan pass (appends rows, skips done ones)
    python -m bench.zoo_ppdet --train  [--until HH:MM]   # training pass (RT-DETR, PicoDet, YOLOX first)
    python -m bench.zoo_ppdet --train --only CONFIG... [--redo] [--run-limit S]   # these rows, again; passes
                                                         # with disjoint --only lists can run side by side
    python -m bench.zoo_ppdet --fp32 CONFIG...           # the same rows' tools/train.py without --amp, 3 steps
    python -m bench.zoo_ppdet --render                   # bench/results/zoo-ppdet.md from the JSON

The tree: ``$PPDET_SRC``, else ``shared/upstream/PaddleDetection-src`` (``$AMPSAFE_SHARED`` or beside the
checkout). Every child gets ``PYTHONPATH`` = the shim folder (:mod:`bench.zoo_ppdet_shim`), the tree, the
checkout and its lab, so the tree's ``ppdet`` wins over an installed one.

What each config runs on: an overlay ``_BASE_: [the config]`` that changes only what a CPU and synthetic data
need (``use_gpu: false``, ``norm_type: bn`` where the config says ``sync_bn``, no pretrained downloads and so
``freeze_norm: false`` where a class freezes its BatchNorms (their frozen statistics would be the initial mean 0 and
variance 1: identities, see ``bench.zoo_ppdet_worker.frozen_norms``), the synthetic COCO folder, ``worker_num: 0``,
batch :data:`BATCH`) and the config's own TrainReader transforms with
their resize targets set to :data:`SIZE` (:func:`shrink`). Its optimizer, learning rate and schedule (warm-up
included) are the config's.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.zoo_ppdet_shim import SHIM, STEPLOG_ENV, STOP_ENV
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


def tree() -> Path:
    shared = Path(os.environ.get("AMPSAFE_SHARED", ROOT.parent / "shared"))
    return Path(os.environ.get("PPDET_SRC") or shared / "upstream" / "PaddleDetection-src")


def family(config: str, architecture: str | None) -> str:
    top = config.split("/", 1)[0]
    if top in _FAMILY_DIRS:
        return top
    return _ARCH_FAMILY.get(architecture or "", (architecture or top).lower())


def child_env(work: Path) -> dict:
    shim = work / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM, encoding="utf-8")
    env = dict(os.environ)
    parts = [str(shim), str(tree()), str(ROOT), str(ROOT / "lab")]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop(STEPLOG_ENV, None)
    env.pop(STOP_ENV, None)
    return env


# --------------------------------------------------------------------------------------------- data and overlay


def write_coco(root: Path, n: int, size: int = SIZE, seed: int = 0) -> Path:
    """``n`` JPEGs with three filled rectangles each, and their COCO json (boxes and rectangle polygons)."""
    import cv2
    import numpy as np

    if (root / "train.json").is_file():
        return root
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(n):
        img = (rng.random((size, size, 3)) * 60).astype(np.uint8)
        for k in range(3):
            category = k % 2 + 1
            x, y = (int(v) for v in rng.integers(5, size // 2, 2))
            w, h = (int(v) for v in rng.integers(size // 6, size // 2, 2))
            img[y : y + h, x : x + w] = 200 if category == 1 else 120
            poly = [x, y, x + w, y, x + w, y + h, x, y + h]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": category,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [poly],
                }
            )
        cv2.imwrite(str(root / "images" / f"{i}.jpg"), img)
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "width": size, "height": size})
    categories = [{"id": 1, "name": "bright"}, {"id": 2, "name": "grey"}]
    (root / "train.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return root


def _target(value, size: int):
    """A resize target of the same form at ``size``: int, [h, w] or a list of them."""
    if isinstance(value, (int, float)):
        return size
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [[size, size]]
    if isinstance(value, list) and len(value) == 2:
        return [size, size]
    return [size]


def shrink(op: dict, size: int = SIZE) -> dict:
    """One transform of the config's TrainReader with its resize targets at ``size`` (other arguments kept)."""
    ((name, args),) = op.items()
    args = dict(args or {})
    if name == "BatchRandomResize":
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


def overlay(record: dict, data: Path, out: Path, *, size: int = SIZE, batch: int = BATCH) -> Path:
    """The user's overlay over the upstream config (see the module docstring); returns its path."""
    import yaml

    reader = dict(record.get("train_reader") or {})
    for key in ("sample_transforms", "batch_transforms"):
        if key in reader:
            reader[key] = [shrink(op, size) for op in reader[key]]
    reader.update(batch_size=batch, shuffle=False, drop_last=True, use_shared_memory=False)
    body: dict = {
        "_BASE_": [str(tree() / "configs" / record["config"])],
        "use_gpu": False,
        "log_iter": 1,
        "snapshot_epoch": 100000,
        "worker_num": 0,
        "pretrain_weights": "",
        "save_dir": str(out / "output"),
        "TrainDataset": {"dataset_dir": str(data), "image_dir": "images", "anno_path": "train.json"},
        "TrainReader": reader,
    }
    for path in record.get("sync_bn") or []:
        _merge(body, _nested(path, "bn"))
    for path in record.get("pretrained") or []:
        _merge(body, _nested(path, ""))
    for path in record.get("frozen_norms") or []:  # no pretrained statistics to freeze: see the module doc
        _merge(body, _nested(path, False))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "overlay.yml"
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
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
            env=child_env(work), cwd=ROOT, capture_output=True, text=True, check=True, timeout=900,
        )  # fmt: skip
    return json.loads(out.read_text())


def _record_path(work: Path, config: str) -> Path:
    return work / "records" / (config.replace("/", "__").removesuffix(".yml") + ".json")


def prefetch(configs: list[str], work: Path) -> None:
    """The worker's records (signature and recipe) of ``configs`` not cached under ``work/records`` yet, read in one
    child (ppdet imported once)."""
    missing = [c for c in configs if not _record_path(work, c).is_file()]
    if not missing:
        return
    (work / "records").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "records", str(tree() / "configs"), str(work / "records")]
    subprocess.run([*cmd, *missing], env=child_env(work), cwd=ROOT, capture_output=True, text=True, timeout=1800)


def complete(record: dict, work: Path) -> dict:
    """``record`` with the recipe keys an enumeration cached before they existed lacks (``frozen_norms``), from
    the worker's record of that config. A config the worker cannot read again keeps its norms as configured (its
    build says why, if it fails)."""
    if "frozen_norms" in record:
        return record
    prefetch([record["config"]], work)
    path = _record_path(work, record["config"])
    fresh = json.loads(path.read_text()) if path.is_file() else {}
    record.update(frozen_norms=fresh.get("frozen_norms") or [])
    return record


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


def scan_one(record: dict, work: Path, data: Path) -> dict:
    record = complete(record, work)
    row = _row_for(record)
    row["unfrozen_norms"] = [".".join(p) for p in record["frozen_norms"]]
    out = work / record["config"].replace("/", "__").removesuffix(".yml")
    path = overlay(record, data, out)
    result_file = out / "scan.json"
    start = time.time()
    env = child_env(work)
    if record.get("dataset") not in COCO_DATASETS:
        env["AMPSAFE_ZOO_BUILD_ONLY"] = f"TrainDataset is {record.get('dataset')}: the sweep writes COCO data only"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.zoo_ppdet_worker", "scan", str(path), str(result_file)]
    code, log = run_group(cmd, timeout=SCAN_TIMEOUT, env=env, cwd=ROOT)
    (out / "scan.log").write_text(log)
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    if result is None and code == 124:
        result = {"built": None, "why_not": f"build + scan over {SCAN_TIMEOUT} s on this CPU (not scanned)"}
    elif result is None:
        tail = [ln for ln in log.strip().splitlines() if ln.strip()]
        result = {"built": None, "why_not": f"worker exit {code}: " + (tail[-1][:300] if tail else "")}
    row.update({k: result.get(k) for k in ("built", "why_not", "scan", "params")})
    row["wall_s"] = {**(result.get("wall_s") or {}), "build+scan total": round(time.time() - start, 1)}
    return row


def run_scan(doc: dict, work: Path, until: str | None) -> None:
    records = {r["config"]: r for r in enumerate_signatures(work)}
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
        row = scan_one(records[sig["chosen"]], work, data)
        doc["rows"].append(row)
        save(doc)
        print(f"scan: {row['config']} built={row['built']} {row['why_not'] or ''} {row['wall_s']}", flush=True)


NATIVE = (
    "import sys, runpy; sys.path.insert(0, '.'); import ppdet.engine; "
    "from ampsafe.paddle import amp_emulation; amp_emulation.install(); "
    "sys.argv = ['tools/train.py'] + sys.argv[1:]; runpy.run_path('tools/train.py', run_name='__main__')"
)


def train_command(run: str, config: Path, report: Path) -> list[str]:
    args = ["-c", str(config), "--amp", "--enable_ce", "True"]  # enable_ce: tools/train.py seeds 0
    if run == "native":
        return [sys.executable, "-c", NATIVE, *args]
    return [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--report", str(report), "--",
            sys.executable, "tools/train.py", *args]  # fmt: skip


def run_group(cmd: list[str], *, timeout: float, **kwargs) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; on timeout the whole group (``ampsafe run``'s child too) is killed."""
    import signal

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs
    )
    try:
        log, _ = proc.communicate(timeout=timeout)
        return proc.returncode, log
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        return 124, (log or "") + f"\ntimeout after {timeout} s on this CPU"


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
    if returncode:
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
        env = child_env(work)
        env[STEPLOG_ENV], env[STOP_ENV] = str(steplog), str(K)
        start = time.time()
        code, log = run_group(train_command(run, config, report), timeout=run_limit, env=env, cwd=tree())
        (folder / "log.txt").write_text(log)
        seconds = round(time.time() - start, 1)
        rep = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else None
        train[run] = summarize_run(_steps(steplog), rep if run == "ampsafe" else None, code, log)
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
            row = scan_one(records[row["config"]], work, data)
            print(f"scan: {row['config']} again with the norms unfrozen {row['wall_s']}", flush=True)
            if not row.get("scan"):
                save_row(row)
                continue
        row["train"] = train_one(row, records[row["config"]], work, data, run_limit)
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
    row = next(r for r in load()["rows"] if r["config"] == config)  # as saved: a parallel pass may have trained it
    records = {r["config"]: r for r in enumerate_signatures(work)}
    data = write_coco(work / "coco", K * BATCH)
    out = work / config.replace("/", "__").removesuffix(".yml")
    path = overlay(complete(records[config], work), data, out)
    steplog = out / "fp32" / "steps.jsonl"
    steplog.parent.mkdir(parents=True, exist_ok=True)
    steplog.unlink(missing_ok=True)
    env = child_env(work)
    env[STEPLOG_ENV], env[STOP_ENV] = str(steplog), str(steps)
    start = time.time()
    cmd = [sys.executable, "tools/train.py", "-c", str(path), "--enable_ce", "True"]
    code, log = run_group(cmd, timeout=run_limit, env=env, cwd=tree())
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
    parser.add_argument("--only", nargs="*", default=None, help="train only these configs (relative to configs/)")
    parser.add_argument("--redo", action="store_true", help="with --only: train again (and scan again if frozen)")
    parser.add_argument("--run-limit", type=float, default=TRAIN_TIMEOUT, help="seconds per training run")
    parser.add_argument("--fp32", nargs="*", default=[], help="float32 check of these configs (no --amp)")
    parser.add_argument("--fp32-steps", type=int, default=FP32_STEPS, help="steps of the float32 check")
    parser.add_argument("--resummarize", action="store_true", help="rebuild the run summaries from the run folders")
    parser.add_argument("--work", default="/tmp/ampsafe-zoo-ppdet")
    args = parser.parse_args(argv)
    if not (tree() / "tools" / "train.py").is_file():
        raise SystemExit(f"needs the PaddleDetection source tree at {tree()}: set PPDET_SRC or AMPSAFE_SHARED")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    doc = load()
    start = time.time()
    if args.scan:
        run_scan(doc, work, args.until)
    if args.train:
        run_train(doc, work, args.until, args.only, args.redo, args.run_limit)
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
