"""The PaddleOCR zoo: every config of an unmodified PaddleOCR 2.x tree, built, scanned and (some) trained.

For each ``configs/**/*.yml`` of the tree (``$PADDLEOCR_SRC``, else ``shared/upstream/PaddleOCR-src``):

* **build**: the model as the tree's own ``tools/train.py`` builds it: its ``main`` runs in-process on the loaded
  config, with ``build_dataloader`` answering a one-batch stand-in (no data is read) and ``build_model`` stopping
  the run once the model is built, so the tree's own out_channels logic (character dictionaries, MultiHead,
  Distillation ``Models``) decides the heads. A config that does not build on this CPU gets ``built: false`` and
  the exception's first line;
* **scan**: ``ampsafe.scan`` at O1 and O2 on a random batch of 2 inputs of the shape the config's transforms make
  (:func:`input_shape`; det and e2e pages at 320x320 to stay CPU-affordable), the model in train mode as
  ``tools/train.py`` runs it, else in eval mode when its train forward needs targets: risky paths, risky ops, the
  least headroom and where;
* **train**: K steps of the tree's own ``tools/train.py`` with float16 emulated, ``native`` (Paddle's GradScaler)
  and under ``ampsafe run --emulate-fp16`` (defaults: heal), at the config's own optimizer and lr, random init,
  Paddle's scaler from 1024 with dynamic scaling, on synthetic data in the family's label format
  (:mod:`bench.ppocr_optin`'s launcher and step log; heals read from ``report.json``);
* the neck's status, read from ``patches/registry.py`` when the table is rendered.

The kie configs import paddlenlp, which lives in its own venv: run their rows through ``bash bench/kie_env.sh VENV --
ARGS``.

``python -m bench.zoo_ppocr --pass scan|train [--only SUBSTR] [--until HH:MM] [--work DIR]`` appends rows to
bench/results/zoo-ppocr.json (resumable: done configs are skipped); the train pass takes the cheapest config of every
algorithm not trained yet first (:func:`train_order`); ``--render`` writes bench/results/zoo-ppocr.md from it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

from bench.common import deadline
from bench.numpy2 import set_sctypes

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "zoo-ppocr"
OUT_JSON, OUT_MD = OUT.with_suffix(".json"), OUT.with_suffix(".md")
K = 20  # training steps per run
BATCH = 2  # scan batch; training batch per card
DET_SIZE = 320  # det / e2e page side for the scan
TRAIN_SIDE = 160  # det / e2e page side for training (the crops of bench/ppocr_optin.py): twice the steps per minute
FAMILIES = ("det", "rec", "cls", "e2e", "table", "kie", "sr")
SCAN_LIMIT_S = 300  # one config's build + both scans


class _Built(Exception):
    """Raised from the wrapped ``build_model`` to stop ``tools/train.py``'s main once the model exists."""

    def __init__(self, model, config):
        super().__init__("built")
        self.model, self.config = model, config


class _Timeout(BaseException):
    pass


def default_src() -> Path | None:
    from bench.ppocr_optin import default_src as optin_src

    src = optin_src()
    return Path(src) if src else None


def configs(src: Path) -> list[str]:
    """Every config of the tree, relative to its configs/ folder, sorted."""
    return sorted(str(p.relative_to(src / "configs")) for p in (src / "configs").rglob("*.yml"))


def _parts(arch: dict, key: str) -> str | None:
    """The ``key`` (Backbone/Neck/Head) class name(s) of an Architecture, Distillation ``Models`` included."""
    if "Models" in arch:
        names = [_parts(m, key) for m in arch["Models"].values() if isinstance(m, dict)]
        names = sorted({n for n in names if n})
        return ", ".join(names) or None
    part = arch.get(key)
    return part.get("name") if isinstance(part, dict) else None


def describe(config: dict) -> dict:
    arch = config.get("Architecture") or {}
    return {
        "architecture": str(arch.get("algorithm") or arch.get("name") or "?"),
        "backbone": _parts(arch, "Backbone") or "",
        "neck": _parts(arch, "Neck"),
        "head": _parts(arch, "Head") or "",
    }


def _transforms(config: dict) -> list[dict]:
    out = []
    for split in ("Train", "Eval"):
        dataset = ((config.get(split) or {}).get("dataset") or {}) if isinstance(config.get(split), dict) else {}
        out += [op for op in dataset.get("transforms") or [] if isinstance(op, dict)]
    return out


def input_shape(config: dict, family: str) -> tuple[int, int, int]:
    """C, H, W of one input as the config's transforms make it (det/e2e: a DET_SIZE page)."""
    if family in ("det", "e2e"):
        return (3, DET_SIZE, DET_SIZE)
    for op in _transforms(config):
        ((name, args),) = op.items()
        args = args or {}
        if name == "PaddingTableImage" and args.get("size"):
            h, w = args["size"]
            return (3, int(h), int(w))
        if name == "SRResize":
            h, w = args.get("imgH", 32), args.get("imgW", 128)
            scale = args.get("down_sample_scale", 2)
            return (3, int(h) // int(scale), int(w) // int(scale))
        shape = args.get("image_shape")
        if name == "GrayRecResizeImg" and isinstance(shape, list) and len(shape) == 2:
            return (1, int(shape[1]), int(shape[0]))  # W, H of a grey line
        if isinstance(shape, list) and len(shape) == 3:
            c, h, w = (int(v) for v in shape)
            if c not in (1, 3) and w in (1, 3):  # RecConAug's image_shape is H, W, C
                c, h, w = w, c, h
            return (c if c > 0 else 3, h if h > 0 else 48, w if w > 0 else 320)
        if isinstance(shape, list) and len(shape) == 2:
            return (3, int(shape[0]), int(shape[1]))
    shape = (config.get("Global") or {}).get("d2s_train_image_shape")
    if isinstance(shape, list) and len(shape) == 3 and min(shape) > 0:
        return tuple(int(v) for v in shape)
    return (3, 48, 320) if family == "rec" else (3, 320, 320)


@contextlib.contextmanager
def _in_tree(src: Path):
    """cwd and sys.path at the tree (its character dictionaries are relative paths), restored after."""
    set_sctypes()
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(src)
    sys.path[:0] = [str(src), str(src / "tools")]
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def build(src: Path, rel: str):
    """The model ``tools/train.py`` builds for ``configs/rel`` (its own main, stopped at build_model)."""
    import logging

    import paddle

    with _in_tree(src), _no_downloads(src) as skipped:
        import tools.program as program
        import tools.train as train

        config = program.load_config(str(src / "configs" / rel))
        missing = write_class_lists(src, config, Path(os.environ.get("TMPDIR", "/tmp")) / "zoo-ppocr-classes")
        if missing:
            skipped.append(f"{missing} absent from the tree: XFUND's class list written in its place")
        config["Global"]["distributed"] = False
        config["Global"]["use_gpu"] = False
        config["Global"]["pretrained_model"] = None
        random_init(config["Architecture"])
        paddle.set_device("cpu")
        original_loader, original_build = train.build_dataloader, train.build_model

        def build_model(arch):
            raise _Built(original_build(arch), config)

        train.build_dataloader = lambda *a, **k: [None]
        train.build_model = build_model
        try:
            with paddle.utils.unique_name.guard():  # a fresh parameter-name registry per config
                train.main(config, "cpu", logging.getLogger("zoo"), None, 1024)
        except _Built as built:
            return built.model, built.config, "; ".join(dict.fromkeys(skipped)) or None
        except Exception as exc:  # noqa: BLE001 - before build_model: the Architecture may still build alone
            stopped = f"tools/train.py stops before build_model on this CPU ({_first_line(exc)})"
            if "Models" in config["Architecture"] or rel.split("/")[0] == "rec":
                raise  # their heads' sizes come from train.py's character logic, which did not run
            with paddle.utils.unique_name.guard():
                model = original_build(config["Architecture"])
            return model, config, "; ".join(dict.fromkeys([stopped, *skipped]))
        finally:
            train.build_dataloader, train.build_model = original_loader, original_build
    raise RuntimeError("tools/train.py's main returned before building the model")


XFUND_CLASSES = ("QUESTION", "ANSWER", "HEADER", "OTHER")  # XFUND's entity classes (7 BIO labels: 2 x 3 + 1)


def write_class_lists(src: Path, config, folder: Path) -> str | None:
    """Point every ``class_path`` of a config that names a file absent from the tree (the XFUND configs'
    ``train_data/XFUND/class_list_xfun.txt``, which the tree does not ship) at XFUND's class list written in
    ``folder``; returns the absent path, or None."""
    missing = None

    def walk(node):
        nonlocal missing
        if isinstance(node, dict):
            for key, value in node.items():
                xfund = isinstance(value, str) and "XFUND" in value
                if key == "class_path" and xfund and not (src / value).is_file():
                    folder.mkdir(parents=True, exist_ok=True)
                    written = folder / Path(value).name
                    written.write_text("\n".join(XFUND_CLASSES) + "\n", encoding="utf-8")
                    node[key], missing = str(written), value
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(config)
    return missing


@contextlib.contextmanager
def _no_downloads(src: Path):
    """Random init where the tree downloads weights whatever the config says: PPLCNetV2's backbone (its
    ``if pretrained:`` is commented out) and the LayoutLM family's ``NLPBaseModel`` (always ``from_pretrained``),
    whose paddlenlp model is built here from paddlenlp's own configuration of that name, untrained. Yields the
    list of what was skipped (the row's ``build_note``); restores both after."""
    import importlib

    skipped: list[str] = []
    restore = []
    lcnet = importlib.import_module("ppocr.modeling.backbones.det_pp_lcnet_v2") if _importable(src) else None
    if lcnet is not None:
        original_load = lcnet.PPLCNetV2._load_pretrained

        def no_load(self, url, use_ssld=False):
            skipped.append(f"PPLCNetV2 weights not downloaded ({url.rsplit('/', 1)[-1]}): random init")

        lcnet.PPLCNetV2._load_pretrained = no_load
        restore.append(lambda: setattr(lcnet.PPLCNetV2, "_load_pretrained", original_load))
    try:
        from paddlenlp.transformers.model_utils import PretrainedModel
    except ImportError:
        PretrainedModel = None
    if PretrainedModel is not None:
        original = PretrainedModel.__dict__["from_pretrained"]

        def from_config(cls, name, *args, **kwargs):
            known = getattr(cls, "pretrained_init_configuration", None) or {}
            if name not in known:
                return original.__func__(cls, name, *args, **kwargs)
            config = cls.config_class(**known[name])
            if "num_classes" in kwargs:
                config.num_labels = kwargs.pop("num_classes")
            if kwargs.pop("dropout", None) == 0:
                config.hidden_dropout_prob = 0.0
            skipped.append(f"paddlenlp {name} not downloaded: random init from paddlenlp's configuration")
            return cls(config)

        PretrainedModel.from_pretrained = classmethod(from_config)
        restore.append(lambda: setattr(PretrainedModel, "from_pretrained", original))
    try:
        yield skipped
    finally:
        for undo in restore:
            undo()


def _importable(src: Path) -> bool:
    return str(src) in sys.path and (src / "ppocr" / "modeling" / "backbones" / "det_pp_lcnet_v2.py").is_file()


def random_init(arch, prefix: str = "Architecture") -> list[str]:
    """Drop every ``pretrained`` weight file or download of an Architecture (Distillation ``Models`` too): the zoo
    starts from random init and reads nothing from disk or network. Returns the ``-o`` options that do the same
    for ``tools/train.py``."""
    options = []
    if isinstance(arch, dict):
        for key, value in arch.items():
            if key == "pretrained" and value not in (None, False, ""):
                arch[key] = False if value is True else None
                options.append(f"{prefix}.{key}={'False' if value is True else ''}")
            elif isinstance(value, dict):
                options += random_init(value, f"{prefix}.{key}")
    return options


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


KIE_TOKENS = 64  # LayoutLM-family scan: tokens per sequence (the configs' max_seq_len is 512)
KIE_BOXES, KIE_CHARS = 8, 12  # SDMGR scan: text boxes per page, characters per box


def kie_inputs(arch: dict, rng) -> tuple[list, str]:
    """One batch in the layout the kie config's KeepKeys hands the model: LayoutLM-family SER/RE ``[input_ids,
    bbox, attention_mask, token_type_ids, image(, entities, relations)]`` (the tensors TensorizeEntitiesRelations
    makes for RE), SDMGR ``[image, relations, texts, points, labels, tag, shape]``."""
    import numpy as np
    import paddle

    backbone = str((arch.get("Backbone") or {}).get("name"))
    if backbone == "Kie_backbone":
        n, chars, side = KIE_BOXES, KIE_CHARS, 512
        image = rng.uniform(-1, 1, (BATCH, 3, side, side)).astype("float32")
        corners = rng.uniform(0, side - 40, (BATCH, n, 2))
        boxes = np.concatenate([corners, corners + rng.uniform(16, 40, (BATCH, n, 2))], -1).astype("float32")
        relations = rng.uniform(-1, 1, (BATCH, n, n, 5)).astype("float32")
        texts = rng.integers(0, 90, (BATCH, n, chars)).astype("int64")
        labels = rng.integers(0, 26, (BATCH, n, n + 1)).astype("int64")
        tag = np.array([[n, chars]] * BATCH, "int64")
        shape = np.array([[side, side, 1, 1]] * BATCH, "int64")
        arrays = [image, relations, texts, boxes, labels, tag, shape]
        described = f"{BATCH}x3x{side}x{side} page, {n} boxes of {chars} characters"
    else:
        tokens = KIE_TOKENS
        ids = rng.integers(5, 1000, (BATCH, tokens)).astype("int64")
        corners = rng.integers(0, 900, (BATCH, tokens, 2))
        bbox = np.concatenate([corners, corners + rng.integers(10, 100, (BATCH, tokens, 2))], -1).astype("int64")
        mask, types = np.ones((BATCH, tokens), "int64"), np.zeros((BATCH, tokens), "int64")
        image = rng.uniform(-1, 1, (BATCH, 3, 224, 224)).astype("float32")
        arrays = [ids, bbox, mask, types, image]
        described = f"{BATCH}x{tokens} tokens, {BATCH}x3x224x224 image"
        if backbone.endswith("ForRe"):
            entities = np.zeros((BATCH, 5, 3), "int64")  # row 0: counts; then start, end, label
            entities[:, 0] = 4
            entities[:, 1:] = [[0, 8, 1], [8, 16, 2], [16, 24, 1], [24, 32, 2]]
            relations = np.zeros((BATCH, 3, 2), "int64")  # row 0: counts; then head, tail
            relations[:, 0] = 2
            relations[:, 1:] = [[0, 1], [2, 3]]
            arrays += [entities, relations]
            described += ", 4 entities, 2 relations"
    return [paddle.to_tensor(a) for a in arrays], described


TABLE_TOKENS = 200  # TableMaster scan: structure tokens a page (PubTabNet's run from tens to a few hundred)


def table_master_targets(head, rng) -> tuple[list, str] | None:
    """The padded structure tokens TableMasterLabelEncode hands a TableMasterHead (``SOS``, the tokens, ``EOS``, then
    ``PAD`` up to ``max_text_length``): its train forward decodes them in one teacher-forced pass. Without them
    the scan falls back to eval mode, whose greedy decoding of 500 steps did not end in 2700 s here."""
    import numpy as np
    import paddle

    if type(head).__name__ != "TableMasterHead":
        return None
    n, classes = head.max_text_length, head.out_channels  # SOS = classes - 3, EOS = classes - 2, PAD = classes - 1
    tokens = np.full((BATCH, n), classes - 1, "int64")
    tokens[:, 0] = classes - 3
    tokens[:, 1 : TABLE_TOKENS + 1] = rng.integers(0, classes - 3, (BATCH, TABLE_TOKENS))
    tokens[:, TABLE_TOKENS + 1] = classes - 2
    return [paddle.to_tensor(tokens)], f"{TABLE_TOKENS} structure tokens padded to {n}"


def scan_model(model, shape: tuple[int, ...], *, sr: bool = False, kie: dict | None = None) -> dict:
    """O1 and O2 scans on a seeded random batch; train mode, else eval mode when the train forward raises."""
    import numpy as np
    import paddle

    import ampsafe

    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.uniform(-1, 1, (BATCH, *shape)).astype("float32"))
    inputs, described = (x,), "x".join(str(v) for v in (BATCH, *shape))
    if sr:  # the SR models' train forward reads [low-resolution, high-resolution] (the config's img_lr, img_hr)
        c, h, w = shape
        hr = paddle.to_tensor(rng.uniform(-1, 1, (BATCH, c, 2 * h, 2 * w)).astype("float32"))
        inputs, described = ([x, hr],), f"[{described}, {BATCH}x{c}x{2 * h}x{2 * w}]"
    if kie is not None:  # the kie models read the list their KeepKeys makes
        batch, described = kie_inputs(kie, rng)
        inputs = (batch,)
    targets = table_master_targets(getattr(model, "head", None), rng)
    if targets is not None:  # BaseModel.forward(x, data) hands data to the head as its targets
        inputs, described = (x, targets[0]), f"{described}, {targets[1]}"
    out = {}
    for level in ("O1", "O2"):
        mode, report, error = "train", None, None
        for mode in ("train", "eval, BatchNorms in train mode"):
            _set_mode(model, mode)
            try:
                report = ampsafe.scan(model, inputs, level=level)
                break
            except Exception as exc:  # noqa: BLE001 - recorded in the row
                error = _first_line(exc)
        model.train()
        if report is None:
            out[level] = {"risky_paths": None, "least_headroom": None, "where": None, "error": error}
            continue
        measured = [p for p in report.paths if p.headroom_bits is not None]
        least = min(measured, key=lambda p: p.headroom_bits, default=None)
        ops = [o for o in report.risky_ops if o.headroom_bits is not None]
        least_op = min(ops, key=lambda o: o.headroom_bits, default=None)
        out[level] = {
            "risky_paths": len(report.risky),
            "unnormalized_paths": sum(1 for p in report.paths if not p.normalized),
            "paths": len(report.paths),
            "least_headroom": None if least is None else round(float(least.headroom_bits), 2),
            "where": None if least is None else least.start,
            "risky_ops": len(report.risky_ops),
            "least_op": None if least_op is None else f"{least_op.module}:{least_op.op}",
            "least_op_headroom": None if least_op is None else round(float(least_op.headroom_bits), 2),
            "risky_starts": sorted(p.start for p in report.risky)[:12],
            "input": described,
            "mode": mode,
        }
    return out


def _set_mode(model, mode: str) -> None:
    """``train``: as tools/train.py runs the model. Otherwise eval mode (heads whose train forward needs the
    targets decode on their own) with every BatchNorm in train mode, normalizing by the batch's statistics as in
    training: in eval mode a random-init BatchNorm divides by its initial running variance (1) and normalizes
    nothing, which no training step sees."""
    import paddle

    model.train()
    if mode == "train":
        return
    model.eval()
    norms = (paddle.nn.layer.norm._BatchNormBase, paddle.nn.BatchNorm)
    for layer in model.sublayers():
        if isinstance(layer, norms):
            layer.train()


def _alarm(seconds: int):
    def handler(signum, frame):
        raise _Timeout(f"over {seconds} s on this CPU")

    signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)


def scan_row(src: Path, rel: str, limit: int = SCAN_LIMIT_S) -> dict:
    import yaml

    family = rel.split("/")[0]
    try:
        raw = yaml.load((src / "configs" / rel).read_text(encoding="utf-8"), Loader=yaml.Loader)
    except Exception as exc:  # noqa: BLE001
        raw, parse_error = {}, _first_line(exc)
    else:
        parse_error = None
    row = {"tree": "PaddleOCR", "config": rel, "family": family, **describe(raw or {})}
    row.update(built=False, why_not=parse_error, scan=None, train=None, wall_s={})
    if parse_error:
        return row
    if limit != SCAN_LIMIT_S:
        row["scan_limit_s"] = limit
    start = time.time()
    _alarm(limit)
    try:
        model, config, note = build(src, rel)
        row["wall_s"]["build"] = round(time.time() - start, 1)
        row["built"] = True
        if note:
            row["build_note"] = note[:300]
        row["params"] = int(sum(int(p.size) for p in model.parameters()))
        shape = input_shape(config, family)
        start = time.time()
        kie = config["Architecture"] if family == "kie" else None
        row["scan"] = scan_model(model, shape, sr=family == "sr", kie=kie)
        row["wall_s"]["scan"] = round(time.time() - start, 1)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a tree's sys.exit, too
        if isinstance(exc, KeyboardInterrupt):
            raise
        key = "build" if not row["built"] else "scan"
        row["wall_s"].setdefault(key, round(time.time() - start, 1))
        if row["built"]:
            row["scan_error"] = _first_line(exc)
        else:
            row["why_not"] = _first_line(exc)
    finally:
        signal.alarm(0)
        model = None
        gc.collect()
    return row


# --- results file ---------------------------------------------------------------------------------------------


def load(path: Path = OUT_JSON) -> dict:
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        from bench.common import machine

        data = {"machine": machine(), "K": K, "rows": []}
    if "commit" not in data["machine"]:
        import subprocess

        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        data["machine"]["commit"] = head.stdout.strip() or None
    return data


def save(data: dict, path: Path = OUT_JSON) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _complete(row: dict) -> bool:
    """Built and scanned at both levels (a row to keep when failed rows are scanned again)."""
    scan = row.get("scan") or {}
    return (
        bool(row.get("built"))
        and all((scan.get(lv) or {}).get("risky_paths") is not None for lv in ("O1", "O2"))
        and all((scan.get(lv) or {}).get("mode") != "eval" for lv in ("O1", "O2"))
    )


def scan_pass(
    src: Path, only: str | None, redo: bool = False, redo_failed: bool = False, limit: int = SCAN_LIMIT_S
) -> None:
    data = load()
    done = set() if redo else {r["config"] for r in data["rows"] if not redo_failed or _complete(r)}
    for rel in configs(src):
        if rel in done or (only and only not in rel):
            continue
        row = scan_row(src, rel, limit)
        data = load()
        before = next((r for r in data["rows"] if r["config"] == rel), None)
        if before and before.get("train"):  # a scan done again keeps the row's training
            row["train"] = before["train"]
            row["wall_s"].update({k: v for k, v in before["wall_s"].items() if k in ("native", "ampsafe")})
        data["rows"] = [r for r in data["rows"] if r["config"] != rel] + [row]
        save(data)
        s = row.get("scan") or {}
        print(
            f"{rel}: built={row['built']} {row.get('why_not') or ''} "
            + " ".join(f"{lv}={s[lv].get('risky_paths')}/{s[lv].get('least_headroom')}" for lv in s)
            + f" {row['wall_s']}",
            flush=True,
        )


# --- training pass ---------------------------------------------------------------------------------------------

LEVEL = "O2"  # Paddle's pure-float16 level: every conv/matmul and most other ops in float16
TRAIN_FIRST = (  # one per family and algorithm first, cheap ones first; after the first five, every config whose scan
    # found a risky path
    "det/det_mv3_db.yml",
    "cls/cls_mv3.yml",
    "rec/rec_mv3_none_bilstm_ctc.yml",
    "det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml",
    "rec/PP-OCRv4/ch_PP-OCRv4_rec.yml",
    "rec/rec_svtrnet.yml",
    "det/det_mv3_east.yml",
    "rec/PP-OCRv3/en_PP-OCRv3_rec.yml",
    "det/det_r18_vd_ct.yml",
    "rec/rec_mtb_nrtr.yml",
    "e2e/e2e_r50_vd_pg.yml",
    "det/det_mv3_pse.yml",
    "rec/rec_r45_abinet.yml",
    "rec/rec_r31_sar.yml",
    "det/det_r50_db++_icdar15.yml",
    "det/det_r50_vd_sast_icdar15.yml",
    "rec/rec_vit_parseq.yml",
    "det/det_r50_vd_dcn_fce_ctw.yml",
    "det/det_r50_drrg_ctw.yml",
)
NO_DATA = {  # families whose label formats the synthetic writers below do not make
    "kie": "LayoutLM-family SER/RE labels (the tree's VQATokenLabelEncode downloads a paddlenlp tokenizer)",
}
DATA_WRITTEN = ("kie/sdmgr/",)  # configs of a NO_DATA family whose labels write_data does write (SDMGR's)


def no_data(rel: str) -> str | None:
    """Why no synthetic data is written for ``configs/rel``, or None."""
    family = rel.split("/")[0]
    return None if rel.startswith(DATA_WRITTEN) else NO_DATA.get(family)


RESIZE_KEYS = ("size", "image_shape", "target_size", "crop_size", "input_size")
TRAIN_LIMIT_S = 900  # one run
SIDES = {"SAST": 128}  # page sides other than TRAIN_SIDE: SASTFPN's upsampled maps match at 128, not 160
SR_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"  # SR labels (LMDBDataSetSR keeps letters and digits)
UNTIL_GRACE_S = 480  # a run started before --until is cut this long after it (and not recorded)


def algorithm(row: dict) -> tuple[str, str]:
    """A row's algorithm: its family and architecture (Distillation counted once per family)."""
    return row["family"], row["architecture"]


def _cost(row: dict) -> float:
    """Build + scan wall seconds: the ordering's stand-in for a config's training cost."""
    wall = row.get("wall_s") or {}
    return float((wall.get("build") or 0) + (wall.get("scan") or 0))


def untried_algorithms(rows: list[dict]) -> list[str]:
    """The cheapest built config of every algorithm of which no config was trained yet, cheapest first."""
    tried = {algorithm(r) for r in rows if r.get("train")}
    cheapest: dict[tuple[str, str], dict] = {}
    for r in sorted((r for r in rows if r.get("built") and not no_data(r["config"])), key=_cost):
        cheapest.setdefault(algorithm(r), r)
    return [r["config"] for key, r in sorted(cheapest.items(), key=lambda kv: _cost(kv[1])) if key not in tried]


def train_order(rows: list[dict]) -> list[str]:
    """One config per untrained algorithm first (cheapest first); then TRAIN_FIRST's first five, every config whose
    scan found a risky path, and the rest of TRAIN_FIRST."""
    built = {r["config"]: r for r in rows if r.get("built")}

    def risky(r):
        return any((lv or {}).get("risky_paths") for lv in (r.get("scan") or {}).values())

    first = [c for c in TRAIN_FIRST[:5] if c in built]
    flagged = sorted(c for c, r in built.items() if risky(r) and c not in first)
    rest = [c for c in TRAIN_FIRST[5:] if c in built and c not in flagged]
    order = untried_algorithms(rows)
    return order + [c for c in first + flagged + rest if c not in order]


def det_transforms(config: dict, side: int = DET_SIZE) -> list[dict]:
    """The config's own Train transforms with every crop / resize size they name at ``side`` (a CPU-affordable
    page). Sizes left at an op's default stay: CT's 640 crops (its loss holds a fixed 640 x 640 coordinate grid),
    PGNet's 512 pages (PGProcessTrain's own constant). PGProcessTrain's ``batch_size`` is set to the loader's
    (PGNet's loss reads each text's image id modulo it)."""
    transforms = json.loads(json.dumps(config["Train"]["dataset"]["transforms"]))
    for op in transforms:
        ((name, args),) = op.items()
        if name == "PGProcessTrain":  # its image ids cycle modulo its batch_size, which must be the loader's
            args["batch_size"] = BATCH
        for key in RESIZE_KEYS:
            value = (args or {}).get(key)
            if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
                args[key] = [side, side]
            elif isinstance(value, int) and not isinstance(value, bool) and value > side:
                args[key] = side
    return transforms


def _charset(src: Path, config: dict) -> str:
    path = (config.get("Global") or {}).get("character_dict_path")
    if not path or not (src / path).is_file():
        return "0123456789abcdefghijklmnopqrstuvwxyz"
    chars = [line.strip("\n\r") for line in (src / path).read_text(encoding="utf-8").splitlines()]
    ascii_chars = [c for c in chars if len(c) == 1 and c.isascii() and c.isalnum()]
    return "".join(ascii_chars[:36] if len(ascii_chars) >= 10 else [c for c in chars if len(c) == 1][:36])


def write_lines(root: Path, chars: str, count: int, *, cls: bool = False, separator: str = "", seed: int = 0) -> Path:
    """``count`` synthetic text lines (48 x 192 px; 3 to 10 characters of ``chars``) and PaddleOCR's rec label file
    (``cls``: the cls label file, half the lines turned by 180 degrees; ``separator``: between the label's symbols,
    a space for CAN's LaTeX token labels)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        text = "".join(rng.choice(list(chars), size=int(rng.integers(3, 11))))
        canvas = np.full((48, 192, 3), int(rng.integers(170, 256)), np.uint8)
        shown = text if text.isascii() else "".join(rng.choice(list("abcdefgh"), size=len(text)))
        ink = tuple(int(c) for c in rng.integers(0, 90, size=3))
        cv2.putText(canvas, shown, (6, 34), cv2.FONT_HERSHEY_SIMPLEX, 0.9, ink, 2, cv2.LINE_AA)
        canvas = np.clip(canvas + rng.normal(0, 8, canvas.shape), 0, 255).astype(np.uint8)
        label = separator.join(text)
        if cls:
            label = "180" if i % 2 else "0"
            canvas = canvas[::-1, ::-1] if i % 2 else canvas
        name = f"images/line_{i:04d}.png"
        cv2.imwrite(str(root / name), np.ascontiguousarray(canvas))
        lines.append(f"{name}\t{label}")
    label_file = root / "train.txt"
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return label_file


TABLE_BOX_SIZES = {"xyxy": 4, "xywh": 4, "xyxyxyxy": 8}


def _table_box(x0: float, y0: float, x1: float, y1: float, box_format: str) -> list[float]:
    if box_format == "xywh":  # TableBoxEncode's xywh: centre, width, height
        return [(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]
    if box_format == "xyxyxyxy":
        return [x0, y0, x1, y0, x1, y1, x0, y1]
    return [x0, y0, x1, y1]


def write_tables(root: Path, count: int, *, box_format: str = "xyxy", seed: int = 0) -> Path:
    """``count`` synthetic ruled tables (2 to 4 rows, 2 to 4 columns, a few characters per cell) and their
    PubTabNet label file (one JSON line each: ``filename``, ``html.structure.tokens`` in PubTabNet's ``<td>``,
    ``</td>`` tokens, ``html.cells`` with ``tokens`` and a ``bbox`` in the config's box format), which the tree's
    ``PubTabDataSet`` reads."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        rows, cols = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        cell_w, cell_h = int(rng.integers(60, 100)), int(rng.integers(28, 40))
        width, height = cols * cell_w + 8, rows * cell_h + 8
        canvas = np.full((height, width, 3), 255, np.uint8)
        tokens, cells = ["<tbody>"], []
        for r in range(rows):
            tokens.append("<tr>")
            for c in range(cols):
                x0, y0 = 4 + c * cell_w, 4 + r * cell_h
                cv2.rectangle(canvas, (x0, y0), (x0 + cell_w, y0 + cell_h), (0, 0, 0), 1)
                text = "".join(rng.choice(list("0123456789abcdefgh"), size=int(rng.integers(1, 5))))
                cv2.putText(canvas, text, (x0 + 6, y0 + cell_h - 10), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1)
                box = _table_box(x0 + 4, y0 + 4, x0 + cell_w - 4, y0 + cell_h - 4, box_format)
                cells.append({"tokens": list(text), "bbox": box})
                tokens += ["<td>", "</td>"]
            tokens.append("</tr>")
        tokens.append("</tbody>")
        name = f"images/table_{i:04d}.png"
        cv2.imwrite(str(root / name), canvas)
        lines.append(json.dumps({"filename": name, "html": {"structure": {"tokens": tokens}, "cells": cells}}))
    label_file = root / "train.txt"
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return label_file


KIE_CLASSES = 26  # SDMGRHead's default num_classes (WildReceipt's 26 key classes)
KIE_DICT = "0123456789abcdefghijklmnopqrstuvwxyz:$.-/ "  # fewer than SDMGRHead's num_chars (92) - 1


def write_receipts(root: Path, count: int, *, seed: int = 0) -> Path:
    """``count`` synthetic receipts (512 x 384 px, 4 to 10 text boxes) and their WildReceipt label file (one line
    each: the image and a JSON list of ``transcription``, ``points`` (4 corners), ``label`` (a class name of
    ``class_list.txt``)), which the tree's ``KieLabelEncode`` reads, with ``dict.txt`` (one character a line) and
    ``class_list.txt`` (KIE_CLASSES names) beside it."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    classes = ["Ignore", *(f"Class{i}" for i in range(1, KIE_CLASSES))]
    (root / "class_list.txt").write_text("\n".join(classes) + "\n", encoding="utf-8")
    (root / "dict.txt").write_text("\n".join(KIE_DICT) + "\n", encoding="utf-8")
    lines = []
    for i in range(count):
        canvas = np.full((512, 384, 3), int(rng.integers(200, 256)), np.uint8)
        boxes = []
        for k in range(int(rng.integers(4, 11))):
            text = "".join(rng.choice(list(KIE_DICT.strip()), size=int(rng.integers(3, 12))))
            x0, y0 = int(rng.integers(8, 200)), 12 + k * 46
            x1, y1 = x0 + 14 * len(text), y0 + 30
            cv2.putText(canvas, text, (x0, y1 - 8), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1)
            points = [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]
            boxes.append(
                {"transcription": text, "points": points, "label": classes[int(rng.integers(0, len(classes)))]}
            )
        name = f"images/receipt_{i:04d}.png"
        cv2.imwrite(str(root / name), canvas)
        lines.append(f"{name}\t{json.dumps(boxes)}")
    label_file = root / "train.txt"
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return label_file


def write_sr_pairs(root: Path, count: int, *, seed: int = 0) -> Path:
    """``count`` synthetic text-line pairs in the LMDB layout the tree's ``LMDBDataSetSR`` reads (TextZoom's:
    ``num-samples``; 1-based ``label-%09d``, ``image_hr-%09d`` 128 x 32 and ``image_lr-%09d`` 64 x 16 PNGs, the
    low-resolution one the high-resolution one shrunk and blurred), in ``lmdb`` and again in ``lmdb_eval``: train.py
    opens its Train and Eval sets in one process, and lmdb opens an environment once per process. Returns the
    ``lmdb`` folder."""
    import cv2
    import lmdb

    lines = root / "lines"
    write_lines(lines, SR_CHARS, count, seed=seed)
    labels = [ln.split("\t") for ln in (lines / "train.txt").read_text(encoding="utf-8").splitlines()]
    for folder in (root / "lmdb", root / "lmdb_eval"):
        folder.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(folder), map_size=1 << 26)
        with env.begin(write=True) as txn:
            for index, (name, label) in enumerate(labels, start=1):
                hr = cv2.resize(cv2.imread(str(lines / name)), (128, 32), interpolation=cv2.INTER_AREA)
                lr = cv2.GaussianBlur(cv2.resize(hr, (64, 16), interpolation=cv2.INTER_AREA), (3, 3), 0)
                txn.put(b"label-%09d" % index, label.encode())
                txn.put(b"image_hr-%09d" % index, cv2.imencode(".png", hr)[1].tobytes())
                txn.put(b"image_lr-%09d" % index, cv2.imencode(".png", lr)[1].tobytes())
            txn.put(b"num-samples", str(len(labels)).encode())
        env.close()
    return root / "lmdb"


def write_stroke_dict(path: Path, chars: str = SR_CHARS, seed: int = 0) -> Path:
    """A synthetic English stroke decomposition (``<char> <strokes>``, strokes digits 1 to 5), the format Gestalt's
    ``SRLabelEncode`` and ``StrokeFocusLoss`` read from ``character_dict_path``; the tree does not ship the file
    (its configs point at ``train_data/srdata/english_decomposition.txt``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = [f"{c} {''.join(rng.choice(list('12345'), size=int(rng.integers(2, 5))))}" for c in chars]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def flatten_points(label_file: Path) -> None:
    """Rewrite a det label file's ``points`` from ``[[x, y], ...]`` to ``[x, y, ...]``: the Total-Text layout CT's
    ``CTLabelEncode`` / ``MakeShrink`` read (they scale each box by a flat ``[sx, sy] * n`` list)."""
    lines = []
    for line in label_file.read_text(encoding="utf-8").splitlines():
        name, label = line.split("\t", 1)
        boxes = json.loads(label)
        for box in boxes:
            box["points"] = [float(v) for point in box["points"] for v in point]
        lines.append(f"{name}\t{json.dumps(boxes)}")
    label_file.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _stroke_dict(config: dict) -> bool:
    """An SR config whose labels are stroke sequences (Gestalt: ``StrokeFocusLoss``)."""
    return "character_dict_path" in (config.get("Loss") or {}) and "SRLabelEncode" in json.dumps(config["Train"])


def _ops(config: dict) -> set[str]:
    return {next(iter(op)) for op in config["Train"]["dataset"].get("transforms") or [] if isinstance(op, dict)}


def train_options(src: Path, rel: str, data: Path, out: Path, side: int = DET_SIZE) -> tuple[list[str], dict]:
    """``tools/train.py``'s ``-o`` options for one zoo run and the recipe they leave (optimizer, lr)."""
    import yaml

    from bench.ppocr_optin import amp_options, loader_options, run_options

    with _in_tree(src):
        import tools.program as program

        config = program.load_config(str(src / "configs" / rel))
    family = rel.split("/")[0]
    labels = f"['{data / 'train.txt'}']"
    optimizer = config.get("Optimizer") or {}
    lr = optimizer.get("lr") or {}
    opts = [
        "Global.use_gpu=False",
        "Global.distributed=False",
        *amp_options(LEVEL),
        "Global.pretrained_model=",
        "Global.checkpoints=",
        "Global.epoch_num=1",
        "Global.cal_metric_during_train=False",
        *run_options(out),
        *random_init(config.get("Architecture") or {}),
        *(["Optimizer.lr.warmup_epoch=0"] if isinstance(lr, dict) and "warmup_epoch" in lr else []),
        *loader_options(data, labels, BATCH),
    ]
    piecewise = lr if isinstance(lr, dict) and lr.get("name") == "Piecewise" else {}
    bounds, values = piecewise.get("decay_epochs") or [], piecewise.get("values") or []
    if values and len(values) <= len(bounds):  # Paddle's PiecewiseDecay wants one value more than boundaries
        opts.append(f"Optimizer.lr.decay_epochs={list(bounds[: len(values) - 1])}")
    if (config.get("Global") or {}).get("use_sync_bn"):  # SyncBatchNorm has no CPU kernel: plain BatchNorm
        opts.append("Global.use_sync_bn=False")
    if (config["Train"]["dataset"].get("ratio_list") or [1.0]) != [1.0]:  # one label file here, read whole
        opts.append("Train.dataset.ratio_list=[1.0]")
    if isinstance(config["Train"].get("sampler"), dict):  # MultiScaleSampler: its own batch sizes (a CPU can't)
        opts += [f"Train.sampler.first_bs={BATCH}", "Train.sampler.fix_bs=True"]
    if family == "sr":  # the tree's LMDBDataSetSR on the pairs write_sr_pairs wrote
        opts += [f"Train.dataset.data_dir={data / 'lmdb'}", f"Eval.dataset.data_dir={data / 'lmdb_eval'}"]
        if _stroke_dict(config):
            strokes = data / "english_decomposition.txt"
            opts += [f"Global.character_dict_path={strokes}", f"Loss.character_dict_path={strokes}"]
    else:  # an LMDB rec set (Train's, Eval's or both) read as PaddleOCR's SimpleDataSet
        opts += [
            f"{split}.dataset.name=SimpleDataSet"
            for split in ("Train", "Eval")
            if "LMDB" in str(((config.get(split) or {}).get("dataset") or {}).get("name"))
        ]
    if family == "kie":  # create_operators hands Global's keys to every op: KieLabelEncode's dictionary and classes
        opts += [f"Global.character_dict_path={data / 'dict.txt'}", f"Global.class_path={data / 'class_list.txt'}"]
    if family in ("det", "e2e"):
        flow = yaml.safe_dump(det_transforms(config, side), default_flow_style=True, width=1 << 20).strip()
        opts.append(f"Train.dataset.transforms={flow}")
    value = lr.get("learning_rate") if isinstance(lr, dict) else None
    recipe = {"optimizer": str(optimizer.get("name")), "lr": value, "lr_schedule": lr.get("name") if lr else None}
    if values and len(values) <= len(bounds):
        recipe["lr_note"] = (
            f"decay_epochs {bounds} cut to {bounds[: len(values) - 1]}: the config's {len(values)} values for "
            f"{len(bounds)} boundaries raise in Paddle's PiecewiseDecay; lr {values[0]} for the K steps either way"
        )
    if "Global.use_sync_bn=False" in opts:
        recipe["sync_bn"] = "off: SyncBatchNorm has no CPU kernel"
    dtype = (config.get("Global") or {}).get("amp_dtype")
    if dtype and dtype != "float16":  # the config's own AMP dtype (the PP-OCRv2/v3 CML configs': bfloat16)
        recipe["amp_dtype"] = dtype
    return opts, recipe


def write_data(src: Path, rel: str, data: Path, *, count: int | None = None, side: int = DET_SIZE) -> None:
    """Synthetic data in the family's label format: det / e2e pages of ``side`` px, rec / cls text lines, table
    structure labels, SR pairs (``train.txt`` marks a written folder)."""
    from bench.ppocr_optin import write_dataset

    with _in_tree(src):
        import tools.program as program

        config = program.load_config(str(src / "configs" / rel))
    family, count = rel.split("/")[0], count or (K + 2) * BATCH
    if family in ("det", "e2e"):
        write_dataset(data, count=count, size=side)
        if "CTLabelEncode" in _ops(config):
            flatten_points(data / "train.txt")
    elif family == "table":
        write_tables(data, count, box_format=str((config.get("Global") or {}).get("box_format") or "xyxy"))
    elif family == "kie":
        write_receipts(data, count)
    elif family == "sr":
        write_sr_pairs(data, count)
        if _stroke_dict(config):
            write_stroke_dict(data / "english_decomposition.txt")
        (data / "train.txt").write_text("\n".join(f"lmdb {i}" for i in range(count)) + "\n", encoding="utf-8")
    else:
        separator = " " if "CANLabelEncode" in _ops(config) else ""
        write_lines(data, _charset(src, config), count, cls=family == "cls", separator=separator)


def train_one(
    src: Path, rel: str, folder: Path, run: str, *, steps: int = K, side: int = DET_SIZE, timeout: float = TRAIN_LIMIT_S
) -> dict:
    """``steps`` steps of ``tools/train.py -c configs/rel`` on ``folder/data``: ``run`` is ``native`` (Paddle's
    GradScaler, float16 emulated) or ``ampsafe`` (``ampsafe run --emulate-fp16``); :func:`bench.ppocr_optin.launch`'s
    result, with ``recipe`` (optimizer, lr) added."""
    from bench.ppocr_optin import command, launch

    out = folder / run
    out.mkdir(parents=True, exist_ok=True)
    opts, recipe = train_options(src, rel, folder / "data", out, side)
    cmd = command(run, f"configs/{rel}", opts, report=None if run == "native" else out / "report")
    result = launch(src, folder, out, cmd, {"run": run}, stop_after=steps, timeout=timeout)
    return {**result, "recipe": recipe}


_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b")


def _raised(log: str) -> str:
    """The line naming the exception that ended a run (the last such line, so a traceback's own exception, not
    what ``ampsafe run`` said after it at exit); else the log's last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    raised = [ln for ln in lines if _RAISED.match(ln)]
    return raised[-1] if raised else (lines[-1] if lines else "")


def _run_record(result: dict) -> dict:
    """One run's row part, read from the step log and (ampsafe) the run's report.json."""
    import math

    from ampsafe.run.records import RunSummary

    record = {
        "overflow_steps": result["overflow_at"],
        "steps_done": result["steps"],
        "final_scale": result["final_scale"],
        "loss_first": result["first_loss"],
        "loss_last": result["final_loss"],
        "finite": result["final_loss"] is not None and math.isfinite(result["final_loss"]),
        "returncode": result["returncode"],
    }
    if result["returncode"] and result["steps"] < K:
        record["error"] = (result.get("error") or _raised(result["log_tail"]))[:300]
    if result.get("report"):
        summary = RunSummary.from_dict(result["report"])
        record["heals"] = [{"step": h.step, "islanded": list(h.paths)} for s in summary.scalers for h in s.heal_records]
    elif "heals" in result and result.get("scaler_class", "") and "ampsafe" in result["scaler_class"]:
        record["heals"] = [{"step": None, "islanded": p} for p in result["healed"]]
    return record


class OutOfTime(Exception):
    """A run cut by the pass's ``--until`` budget rather than by TRAIN_LIMIT_S: its row is not written."""


def _timed_out(out: Path, limit: float) -> dict:
    """A run cut at its time limit, as :func:`bench.ppocr_optin.launch` would have returned it, from the steps its
    step log holds and the losses its log printed (``ampsafe run`` writes report.json at exit only: no report)."""
    from bench.ppocr_optin import summarize, with_printed_losses

    path, log_path = out / "steps.jsonl", out / "log.txt"
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    log = log_path.read_text(encoding="utf-8") if log_path.is_file() else ""
    result = summarize(with_printed_losses(steps, log))
    error = result["error"] or f"stopped: over {limit:.0f} s on this CPU"
    return {**result, "returncode": -9, "log_tail": log[-4000:], "report": None, "error": error}


def run_folder(src: Path, rel: str, work: Path) -> tuple[Path, int]:
    """The config's folder under ``work`` with its synthetic data written (once), and its training page side."""
    folder = work / rel.replace("/", "__").removesuffix(".yml")
    side = SIDES.get(next((a for a in SIDES if f"_{a.lower()}_" in rel), ""), TRAIN_SIDE)
    if not (folder / "data" / "train.txt").is_file():
        write_data(src, rel, folder / "data", side=side)
    return folder, side


def train_row(
    src: Path, rel: str, work: Path, deadline: float | None = None, run_limit: float = TRAIN_LIMIT_S
) -> tuple[dict, dict]:
    """``(train, wall_s)`` of one config: K steps native and under ``ampsafe run --emulate-fp16``; each run cut at
    ``run_limit`` seconds (a row, with the steps done) or at ``deadline`` (epoch seconds: :class:`OutOfTime`, no
    row)."""
    import subprocess

    folder, side = run_folder(src, rel, work)
    train, wall = {"steps": K, "level": LEVEL, "batch": BATCH}, {}
    for run in ("native", "ampsafe"):
        start = time.time()
        limit = run_limit if deadline is None else min(run_limit, deadline - start)
        if limit < 30:
            raise OutOfTime(f"{rel}: no time left for the {run} run")
        try:
            result = train_one(src, rel, folder, run, side=side, timeout=limit)
        except subprocess.TimeoutExpired as exc:
            if limit < run_limit:
                raise OutOfTime(f"{rel}: the {run} run was cut at the --until budget") from exc
            train.update(train_options(src, rel, folder / "data", folder / run, side)[1])
            train[run] = _run_record(_timed_out(folder / run, limit))
        except Exception as exc:  # noqa: BLE001 - a timeout is a row, too
            train[run] = {"error": _first_line(exc)}
        else:
            train.update(result["recipe"])
            train[run] = _run_record(result)
        wall[run] = round(time.time() - start, 1)
    return train, wall


def train_pass(
    src: Path,
    only: str | None,
    work: Path = Path("/tmp/zoo-ppocr-train"),
    *,
    until: str | None = None,
    redo: bool = False,
    run_limit: float = TRAIN_LIMIT_S,
) -> None:
    """Train the configs of :func:`train_order` not trained yet (``redo``: the ``only`` ones again); start none
    after ``until`` (HH:MM UTC), and cut a run UNTIL_GRACE_S after it without writing its row."""
    data, stop = load(), deadline(until)
    order = train_order(data["rows"])
    if only:  # any built config it names, in the order or not
        order += [r["config"] for r in data["rows"] if r.get("built") and r["config"] not in order]
    for rel in order:
        if only and only not in rel:
            continue
        if stop is not None and time.time() >= stop:
            print(f"train: stopped at {until} UTC", flush=True)
            break
        row = next(r for r in load()["rows"] if r["config"] == rel)
        if (row.get("train") and not (redo and only)) or no_data(rel):
            continue
        try:
            train, wall = train_row(src, rel, work, None if stop is None else stop + UNTIL_GRACE_S, run_limit)
        except OutOfTime as exc:
            print(f"train: {exc}; row not written", flush=True)
            break
        data = load()
        for r in data["rows"]:
            if r["config"] == rel:
                r["train"] = train
                r["wall_s"].update(wall)
        save(data)
        n, a = train["native"], train["ampsafe"]
        print(
            f"{rel}: native {n.get('overflow_steps')} {n.get('error', '')} | ampsafe {a.get('overflow_steps')} "
            f"heals {a.get('heals')} {a.get('error', '')} {wall}",
            flush=True,
        )


AMP_OPTIONS = ("Global.use_amp=", "Global.amp_level=", "Global.scale_loss=", "Global.use_dynamic_loss_scaling=")
# families whose training fails in the tree's own AMP code path, read in tools/program.py (and checked by --fp32)
AMP_BRANCH_BREAKS = {
    "sr": "tools/program.py's AMP branch calls model(images) for SR models (lines 321-328), its float32 branch "
    "model(batch) (lines 338-339): TBSRN/TSRN then read one image of the low-resolution batch as the batch",
}


def fp32_row(src: Path, rel: str, work: Path, run_limit: float = TRAIN_LIMIT_S) -> dict:
    """``tools/train.py`` on the row's config and data with ``Global.use_amp=False``: whether a config that fails
    under AMP trains in float32. No scaler, so no step log: the losses are the printed ones, one epoch of the
    synthetic data."""
    from bench.ppocr_optin import command, launch, parse_log

    folder, side = run_folder(src, rel, work)
    out = folder / "fp32"
    out.mkdir(parents=True, exist_ok=True)
    opts, _ = train_options(src, rel, folder / "data", out, side)
    opts = [o for o in opts if not o.startswith(AMP_OPTIONS)] + ["Global.use_amp=False"]
    result = launch(src, folder, out, command("native", f"configs/{rel}", opts), {"run": "fp32"}, stop_after=None,
                    timeout=run_limit)  # fmt: skip
    losses = list(parse_log((out / "log.txt").read_text(encoding="utf-8")).values())
    run = {
        "steps_done": len(losses),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses),
        "returncode": result["returncode"],
    }
    if result["returncode"]:
        run["error"] = _raised(result["log_tail"])[:300]
    return run


def fp32_pass(src: Path, only: str, work: Path, run_limit: float = TRAIN_LIMIT_S) -> None:
    """:func:`fp32_row` for the built configs ``only`` names, stored as their rows' ``fp32``."""
    for rel in [r["config"] for r in load()["rows"] if r.get("built") and only in r["config"]]:
        run = fp32_row(src, rel, work, run_limit)
        data = load()
        next(r for r in data["rows"] if r["config"] == rel)["fp32"] = run
        save(data)
        print(f"{rel}: float32 {run}", flush=True)


# --- rendering -------------------------------------------------------------------------------------------------


def neck_status(neck: str | None) -> str | None:
    """The neck's status in patches/registry.py now (a Distillation row's necks joined)."""
    if not neck:
        return None
    from ampsafe.patches import registry

    def one(name: str) -> str:
        if registry.safe_neck(registry.PADDLEOCR, name):
            return "safe variant registered"
        why = registry.already_safe_reason(registry.PADDLEOCR, name)
        return f"already safe: {why}" if why else "not covered"

    return "; ".join(f"{n}: {one(n)}" if "," in neck else one(n) for n in neck.split(", "))


def _g(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _scan_cell(level: dict | None) -> str:
    if not level:
        return "-"
    if level.get("risky_paths") is None:
        error = level.get("error") or ""
        error = re.sub(r"ScanError: the model raised (\w+) while ampsafe.scan ran it on example_inputs:", r"\1:", error)
        return f"forward failed: {error.split('. The model was left')[0][:110]}"
    cell = f"{level['risky_paths']} / {_g(level['least_headroom'])} `{level['where']}`"
    if level.get("risky_ops"):
        cell += f"; {level['risky_ops']} op(s), least `{level['least_op']}` {_g(level['least_op_headroom'])}"
    return cell


def _steps(steps: list | None) -> str:
    if not steps:
        return "none"
    return f"{len(steps)} ({', '.join(map(str, steps[:6]))}{', ...' if len(steps) > 6 else ''})"


def _run_cell(run: dict | None, *, heals: bool) -> str:
    if not run:
        return "-"
    if "overflow_steps" not in run or not run.get("steps_done"):
        return f"error: {run.get('error', '')}"  # the exception's first line, as stored
    cell = (
        f"{run['steps_done']} steps; overflow {_steps(run['overflow_steps'])}; scale {_g(run['final_scale'], 6)}; "
        + (
            "loss not in the step log"  # the scaler's step record carried no loss value
            if run["loss_first"] is None and run["loss_last"] is None
            else f"loss {_g(run['loss_first'])} → {_g(run['loss_last'])}{'' if run['finite'] else ' (not finite)'}"
        )
    )
    if heals and run.get("heals"):
        cell += "; heals " + "; ".join(
            f"step {h['step']}: {', '.join(f'`{p}`' for p in h['islanded'][:6])}"
            + (f" +{len(h['islanded']) - 6}" if len(h["islanded"]) > 6 else "")
            for h in run["heals"]
        )
    if run.get("error"):
        cell += f"; {'' if run['error'].startswith('stopped') else 'stopped: '}{run['error'][:200]}"
    return cell


def _not_trained(row: dict) -> str:
    if not row.get("built"):
        return "not built"
    if no_data(row["config"]):
        return f"not trained: no synthetic {no_data(row['config'])} written"
    if not _complete(row) and not any(((row.get("scan") or {}).get(lv) or {}).get("mode") for lv in ("O1", "O2")):
        return "not trained: time budget; scan failed"
    risky = any((lv or {}).get("risky_paths") for lv in (row.get("scan") or {}).values())
    return "not trained: time budget; " + ("scan found risky paths" if risky else "scan clean")


def render(path: Path = OUT_JSON, out: Path = OUT_MD) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = sorted(
        data["rows"], key=lambda r: (FAMILIES.index(r["family"]) if r["family"] in FAMILIES else 99, r["config"])
    )
    m = data["machine"]
    total = sum(sum(v for v in r.get("wall_s", {}).values() if v) for r in rows)
    lines = [
        "# PaddleOCR zoo under emulated float16",
        "",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores (shared with other jobs: wall times are load-inflated), "
        f"paddle {m.get('paddle')}, python {m.get('python')}; started {m.get('date', '?')}, commit "
        f"{m.get('commit', '?')}. Tree: PaddleOCR 2.x (`shared/upstream/PaddleOCR-src`), every `configs/**/*.yml`. "
        "Made by `python -m bench.zoo_ppocr --pass scan`, `--pass train`, `--render`.",
        "",
        "* **build**: the tree's own `tools/train.py` main (data loader stubbed, stopped at `build_model`), random "
        "init (`pretrained` keys dropped); where train.py stops before `build_model` on this CPU (post-process "
        "compile, missing package) a det/kie Architecture is built by `build_model` alone (noted). Where the tree "
        "downloads weights whatever the config says (PPLCNetV2's backbone; the LayoutLM family's `NLPBaseModel`, "
        "always `from_pretrained`) the download is skipped and the model random-initialized (from paddlenlp's own "
        "configuration of that name; noted). The kie rows run from `bench/kie_env.sh`'s venv (paddlenlp 2.8.1).",
        f"* **scan**: `ampsafe.scan` at O1 and O2, model in train mode (where its train forward needs targets: TableMaster's are {TABLE_TOKENS} structure tokens padded to its max_text_length, the others' eval mode with the BatchNorms in train mode, noted), a seeded uniform(-1, 1) "
        f"batch of {BATCH}; det/e2e pages {DET_SIZE}x{DET_SIZE}, others the shape of the config's transforms; kie "
        f"the list its KeepKeys makes: LayoutLM family {KIE_TOKENS} tokens (the configs' max_seq_len is 512) and a "
        f"224x224 image (RE: 4 entities, 2 relations), SDMGR a 512x512 page with {KIE_BOXES} boxes of "
        f"{KIE_CHARS} characters. A row scanned under a longer limit than {SCAN_LIMIT_S} s says so. Cell: "
        "risky paths / least headroom in bits (log2(65504/amax)) `where`; risky float16 ops (e.g. `exp`) after.",
        f"* **train**: K = {data.get('K', K)} steps of `tools/train.py` at {LEVEL}, float16 emulated, batch {BATCH}, "
        "the config's optimizer and lr (warmup off), random init, Paddle's scaler from 1024 with dynamic scaling, "
        f"synthetic data ({TRAIN_SIDE} px pages for det/e2e where the config names the size (CT 640, PGNet 512), "
        "48x192 text lines for rec/cls, ruled tables with "
        "PubTabNet structure labels for table, 128x32 / 64x16 line pairs in TextZoom's LMDB layout for sr, Gestalt "
        "with a synthetic stroke decomposition; 512x384 receipts in WildReceipt's label format for SDMGR, 26 "
        "classes; PGNet's PGProcessTrain `batch_size` set to the loader's; a Piecewise lr with as many values as "
        "boundaries (SDMGR's, which Paddle rejects) loses its last boundary, the lr of the K steps unchanged; XFUND's "
        "class list, which the tree does not ship, written where a kie config names it; `use_sync_bn` off where a config sets it, "
        "SyncBatchNorm having no CPU kernel); native = Paddle's "
        "GradScaler; ampsafe = `ampsafe run --emulate-fp16` (defaults: heal), heals read from its report.json. "
        "A MultiScaleSampler config gets `first_bs` 2 with `fix_bs`, an LMDB rec set PaddleOCR's SimpleDataSet. "
        "Steps are 0-based.",
        f"* Sweep wall time: {total / 60:.0f} min over {len(rows)} rows.",
        "",
        "| config | arch | backbone | neck | neck status | built | O1 scan | O2 scan | native | ampsafe | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        built = "yes" if r["built"] else f"no: {(r.get('why_not') or '')[:120]}"
        if r.get("build_note"):
            built += f" ({'; '.join(dict.fromkeys(r['build_note'].split('; ')))[:300]})"
        if r.get("scan_limit_s"):
            built += f"; scan limit {r['scan_limit_s']} s"
        scan = r.get("scan") or {}
        if r.get("scan_error"):
            scan = {"O1": {"risky_paths": None, "error": r["scan_error"].replace("_Timeout", "stopped")}}
        modes = {lv.get("mode") for lv in scan.values() if lv} - {"train", None}
        if modes:
            built += f"; scanned in {modes.pop()} (its train forward needs targets)"
        train = r.get("train")
        native = _run_cell(train.get("native"), heals=False) if train else _not_trained(r)
        if train and train.get("lr_note"):
            native += f" (lr schedule: {train['lr_note'].split(':')[0]})"
        if train and train.get("amp_dtype"):
            native += (
                f" (the config's `amp_dtype: {train['amp_dtype']}`: the emulation runs those blocks in float32, and "
                "ampsafe's scaler stays off: no loss scaling in bfloat16)"
            )
        if r.get("fp32"):
            f = r["fp32"]
            native += (
                f"; float32 (`use_amp` off): {f['steps_done']} steps"
                + (f", loss {_g(f['loss_first'])} → {_g(f['loss_last'])}" if f["loss_first"] is not None else "")
                + (f", {f['error']}" if f.get("error") else "")
            )
        if train and (train.get("native") or {}).get("error") and r["family"] in AMP_BRANCH_BREAKS:
            native += f" (cause: {AMP_BRANCH_BREAKS[r['family']]})"
        ampsafe = _run_cell(train.get("ampsafe"), heals=True) if train else ""
        wall = ", ".join(f"{k} {v:.0f}" for k, v in r.get("wall_s", {}).items() if v is not None)
        lines.append(
            f"| {r['config']} | {r['architecture']} | {r['backbone']} | {r['neck'] or '-'} | "
            f"{(neck_status(r['neck']) or '-').split(' (')[0].split(': ppdet')[0]} | {built} | "
            f"{_scan_cell(scan.get('O1'))} | {_scan_cell(scan.get('O2'))} | {native} | {ampsafe} | {wall} |"
        )
    lines += ["", "## What this shows", "", *what_this_shows(rows, data.get("K", K))]
    text = "\n".join(lines) + "\n"
    out.write_text(text, encoding="utf-8")
    return text


def what_this_shows(rows: list[dict], k: int) -> list[str]:
    """Measured facts only, counted from the rows."""
    built = [r for r in rows if r["built"]]
    unbuilt = [r for r in rows if not r["built"]]
    out = [
        f"* {len(built)} of {len(rows)} configs build on this CPU; {len(unbuilt)} do not (the reason is in the row)."
    ]
    for level in ("O1", "O2"):
        risky = [r for r in built if ((r.get("scan") or {}).get(level) or {}).get("risky_paths")]
        ops = [r for r in built if ((r.get("scan") or {}).get(level) or {}).get("risky_ops")]
        out.append(
            f"* {level} scan at random init: {len(risky)} config(s) with a risky path"
            + (f" ({', '.join(r['config'] for r in risky)})" if risky else "")
            + f"; {len(ops)} with a float16 op out of range"
            + (f" ({', '.join(sorted({r['family'] for r in ops}))} families)" if ops else "")
            + "."
        )
    trained = [r for r in built if r.get("train")]
    if not trained:
        return out + ["* No config was trained."]
    over = [r for r in trained if (r["train"].get("native") or {}).get("overflow_steps")]
    clean = [r for r in trained if (r["train"].get("native") or {}).get("steps_done") == k and r not in over]
    healed = [r for r in trained if (r["train"].get("ampsafe") or {}).get("heals")]
    failed = [
        r
        for r in trained
        if any(
            "overflow_steps" not in (r["train"].get(k2) or {}) or (r["train"].get(k2) or {}).get("error")
            for k2 in ("native", "ampsafe")
        )
    ]
    out.append(
        f"* Trained {len(trained)} config(s) for {k} steps at {LEVEL}. Native runs with overflowing steps: "
        + (", ".join(f"{r['config']} ({len(r['train']['native']['overflow_steps'])})" for r in over) or "none")
        + ". Never overflowed natively in these steps from random init: "
        + (", ".join(r["config"] for r in clean) or "none")
        + "."
    )
    out.append(
        "* `ampsafe run` healed: "
        + (
            "; ".join(
                f"{r['config']} (islanded "
                + ", ".join(sorted({p for h in r["train"]["ampsafe"]["heals"] for p in h["islanded"]})[:6])
                + ")"
                for r in healed
            )
            or "none"
        )
        + "."
    )
    if failed:
        out.append(
            "* Runs that stopped before K steps or did not start: " + ", ".join(r["config"] for r in failed) + "."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zoo_ppocr", description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=default_src(), type=Path, help="PaddleOCR checkout")
    parser.add_argument("--pass", dest="which", choices=("scan", "train"), default=None)
    parser.add_argument("--only", default=None, help="configs whose path contains this")
    parser.add_argument("--redo", action="store_true", help="scan (or train) again the configs --only selects")
    parser.add_argument("--redo-failed", action="store_true", help="scan again the rows not built or not scanned")
    parser.add_argument("--render", action="store_true", help="write zoo-ppocr.md from zoo-ppocr.json")
    parser.add_argument(
        "--fp32", default=None, metavar="ONLY", help="train the configs whose path contains this without use_amp"
    )
    parser.add_argument(
        "--until",
        default=None,
        help=f"HH:MM UTC: the train pass starts no config after it; a run still going {UNTIL_GRACE_S} s after it "
        "is cut and its row not written",
    )
    parser.add_argument(
        "--scan-limit", type=int, default=SCAN_LIMIT_S, help="seconds one config's build and scans may take"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/zoo-ppocr-train"),
        help="folder of the train pass's synthetic data and run outputs (one per config)",
    )
    parser.add_argument(
        "--run-limit", type=float, default=TRAIN_LIMIT_S, help="seconds one training run may take (its row says so)"
    )
    args = parser.parse_args(argv)
    if args.which and not args.src:
        parser.error("no PaddleOCR tree: set PADDLEOCR_SRC or pass --src")
    if args.which == "scan":
        if args.redo and not args.only:
            parser.error("--redo needs --only")
        scan_pass(args.src, args.only, args.redo, args.redo_failed, args.scan_limit)
    elif args.which == "train":
        if args.redo and not args.only:
            parser.error("--redo needs --only")
        train_pass(args.src, args.only, args.work, until=args.until, redo=args.redo, run_limit=args.run_limit)
    if args.fp32:
        fp32_pass(args.src, args.fp32, args.work, args.run_limit)
    if args.render:
        render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
