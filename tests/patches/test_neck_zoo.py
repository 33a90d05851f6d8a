"""Every neck class PaddleOCR and PaddleDetection register, built by the tree's own code at a configuration of its
own configs (tests/patches/neck_zoo_cases.py) and checked from the built object (ampsafe.patches.neck_check):
the registry's table (ampsafe.patches.registry.neck_table) says for each one what the check measures, and each
safe variant loads the upstream neck's state_dict with only its documented new keys missing and checks safe.

PaddleOCR runs in this process (its ``ppocr`` from shared/upstream/PaddleOCR-src). PaddleDetection runs in one
subprocess (tests/patches/ppdet_neck_zoo.py) with shared/upstream/PaddleDetection-src first on PYTHONPATH, so that
the tree is the ppdet read, whichever ppdet this process imported; without the tree, the installed ppdet.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import neck_zoo_cases as cases
import pytest

from ampsafe.patches import registry
from ampsafe.patches.registry import PADDLEDET, PADDLEOCR

HERE = Path(__file__).parent


def _table(ecosystem: str) -> dict[str, tuple[str, str]]:
    return {name: (status, detail) for eco, name, status, detail in registry.neck_table() if eco == ecosystem}


def test_neck_table_lists_every_neck_once_and_renders_it():
    rows = registry.neck_table()
    assert len({(eco, name) for eco, name, _, _ in rows}) == len(rows)
    text = registry.render_neck_table()
    assert text.count("\n") == len(rows) + 1
    for _eco, name, status, _ in rows:
        assert f"| {name} | {status} |" in text


def test_swap_neck_list_prints_the_table_without_importing_paddle():
    code = "import sys; from ampsafe.patches import swap; swap.main(['--list']); assert 'paddle' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == registry.render_neck_table()


# ------------------------------------------------------------------------------------------------- PaddleOCR


@pytest.fixture(scope="module")
def ppocr(paddleocr_src):
    sys.path.insert(0, str(paddleocr_src))
    try:
        import ppocr.modeling.necks as necks

        yield necks
    finally:
        sys.path.remove(str(paddleocr_src))


def _support_dict(src: Path) -> set[str]:
    """The names ``ppocr.modeling.necks.build_neck`` accepts, read from its code (a list local to the function)."""
    tree = ast.parse((src / "ppocr/modeling/necks/__init__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "support_dict" for t in node.targets):
            return {element.value for element in node.value.elts}
    raise AssertionError("no support_dict in ppocr/modeling/necks/__init__.py")


def _ocr_args(src: Path, name: str) -> dict:
    import yaml

    rel, maps = cases.OCR[name]
    section = {}
    if rel:
        arch = yaml.safe_load((src / "configs" / rel).read_text(encoding="utf-8"))["Architecture"]
        section = {k: v for k, v in arch["Neck"].items() if k != "name"}
        assert arch["Neck"]["name"] == name
    channels = [c for c, _, _ in maps]
    in_channels = channels[0] if name in ("SequenceEncoder", "RFAdaptor") else channels
    extra = cases.OCR_TABLEFPN_ARGS if name == "TableFPN" else {}
    return {**extra, **section, "in_channels": in_channels}


def _ocr_inputs(name: str) -> tuple:
    import paddle

    paddle.seed(0)
    maps = [paddle.rand([1, c, h, w]) for c, h, w in cases.OCR[name][1]]
    return (maps[0],) if name == "SequenceEncoder" else (maps,)


def _ocr_build(ppocr, name: str, src: Path, cls=None, settings: dict | None = None):
    args = {**_ocr_args(src, name), **(settings or {})}
    neck = ppocr.build_neck({"name": name, **copy.deepcopy(args)}) if cls is None else cls(**copy.deepcopy(args))
    neck.eval()
    return neck


def test_the_table_names_exactly_the_necks_paddleocrs_build_neck_accepts(paddleocr_src):
    assert set(_table(PADDLEOCR)) == _support_dict(paddleocr_src) == set(cases.OCR)


def _check(neck, inputs):
    from ampsafe.patches.neck_check import check_neck

    return check_neck(neck, inputs)


def _assert_reason(detail: str, check, neck) -> None:
    """The already-safe detail says what the check measured: no open path; only inner links when it says so;
    every conv in a one-conv conv + norm block when it says so."""
    from ampsafe.paddle.backend import BACKEND
    from ampsafe.patches.normed_necks import in_conv_norm_block

    assert check.safe, check.reason()
    assert bool(check.inner) == detail.startswith(registry.INNER_LINKS), (detail, check.inner)
    if detail.startswith("builds every conv as a conv + "):
        parents = {id(c): (p, n) for p in [neck, *neck.sublayers()] for n, c in p.named_children()}
        convs = [c for _, c in neck.named_sublayers() if isinstance(c, BACKEND.swaps.convs)]
        assert convs and all(in_conv_norm_block(*parents[id(c)]) for c in convs), detail
    if "nn.Linear" in detail:
        assert "linear" in set(check.ops.values()) and check.normalized_paths, check.reason()


@pytest.mark.parametrize("name", sorted(n for (e, n) in registry.ALREADY_SAFE if e == PADDLEOCR))
def test_paddleocr_already_safe_neck_is_measured_safe_for_the_reason_given(ppocr, paddleocr_src, name):
    neck = _ocr_build(ppocr, name, paddleocr_src)
    _assert_reason(registry.ALREADY_SAFE[(PADDLEOCR, name)], _check(neck, _ocr_inputs(name)), neck)


def _load(variant, upstream):
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # paddle warns once per key it skips
        missing, unexpected = variant.set_state_dict(upstream.state_dict())
    state = variant.state_dict()
    assert all(np.array_equal(state[k].numpy(), v.numpy()) for k, v in upstream.state_dict().items())
    return set(missing), set(unexpected)


@pytest.mark.parametrize("name", sorted(s.upstream for s in registry.SAFE_NECKS.values() if s.ecosystem == PADDLEOCR))
def test_paddleocr_safe_variant_loads_the_upstream_keys_and_checks_safe(ppocr, paddleocr_src, name):
    spec = registry.safe_neck(PADDLEOCR, name)
    inputs = _ocr_inputs(name)
    settings = cases.OCR_VARIANT_SETTINGS.get(name)
    upstream = _ocr_build(ppocr, name, paddleocr_src, settings=settings)
    measured = _check(upstream, inputs)
    assert not measured.safe and _table(PADDLEOCR)[name][0] == "safe variant"
    variant = _ocr_build(ppocr, name, paddleocr_src, cls=registry.load_class(spec), settings=settings)
    _assert_one_rule(spec, upstream, measured, variant, inputs)


def _assert_one_rule(spec, upstream, measured, variant, inputs) -> None:
    """The variant loads the upstream state_dict with only its new keys missing and checks safe; a one-rule variant
    normalizes exactly the conv / linear layers the check found unnormalized, and what else was open (a matmul
    written as a function inside a layer's forward, PRENFPN's bmm) is then an inner link."""
    from paddle import nn

    from ampsafe.paddle.backend import BACKEND
    from ampsafe.patches.normed_necks import BN_KEYS, LN_KEYS, added_keys

    missing, unexpected = _load(variant, upstream)
    assert not unexpected
    assert missing == set(variant.state_dict()) - set(upstream.state_dict())
    checked = _check(variant, inputs)
    assert checked.safe, checked.reason()
    if spec.upstream_class:  # one rule: a BatchNorm after exactly the layers the check found unnormalized
        layers = dict(upstream.named_sublayers())
        kinds = (*BACKEND.swaps.convs, nn.Linear)
        normable = {p for p in measured.unnormalized if isinstance(layers.get(p), kinds)}
        assert set(variant.ampsafe_normalized) == normable, measured.reason()
        assert set(measured.unnormalized) - normable <= set(checked.inner), checked.reason()
        convs = {p for p in normable if isinstance(layers[p], BACKEND.swaps.convs)}
        expected = {f"{c}.bn.{k}" for c in convs for k in BN_KEYS}
        assert missing == expected | {f"{p}.norm.{k}" for p in normable - convs for k in LN_KEYS}
        assert added_keys(variant) == missing
        for clone in (copy.deepcopy(variant), pickle.loads(pickle.dumps(variant))):  # EMA copies, checkpoints
            assert type(clone) is type(variant) and set(clone.state_dict()) == set(variant.state_dict())
    else:  # the hand-written DB necks: their BatchNorms are siblings named *_bn
        assert missing and all("_bn" in k for k in missing)


def test_no_neck_is_left_not_covered():
    assert not registry.NOT_COVERED
    assert "not covered" not in {status for _, _, status, _ in registry.neck_table()}


def _sequence_encoder_args(**settings) -> dict:
    return {"in_channels": cases.OCR["SequenceEncoder"][1][0][0], "hidden_size": 96, **settings}


# SequenceEncoder's settings as built for the check: the section of a config that names it, else the defaults
_SVTR = {"dims": 64, "depth": 2, "hidden_dims": 120, "use_guide": True}  # PP-OCRv3's MultiHead CTC encoder
_CASCADE = {"hidden_size": 256, "out_channels": [512, 512], "with_linear": False}  # widths that chain without linears
_SETTINGS = {"rnn": {}, "reshape": {}, "svtr": _SVTR, "cascadernn": _CASCADE}


@pytest.mark.parametrize("value", sorted(registry.SETTING_SAFE[(PADDLEOCR, "SequenceEncoder")][1]))
def test_sequence_encoder_settings_the_swap_refuses_are_measured_safe_for_the_reason_given(ppocr, value):
    key, reasons, _ = registry.SETTING_SAFE[(PADDLEOCR, "SequenceEncoder")]
    args = _sequence_encoder_args(**{key: value}, **_SETTINGS[value])
    neck = ppocr.build_neck({"name": "SequenceEncoder", **copy.deepcopy(args)})
    neck.eval()
    check = _check(neck, _ocr_inputs("SequenceEncoder"))
    detail = reasons[value]
    _assert_reason(detail, check, neck)
    if "LSTM" in detail:  # every LSTM's input GEMM is a measured path that ends at its bounded output
        assert set(check.ops.values()) == {"rnn_input_matmul"} and check.normalized_paths == len(check.ops)
    if "no conv or matmul" in detail:
        assert not check.ops
    variant = registry.load_class(registry.safe_neck(PADDLEOCR, "SequenceEncoder"))(**args)
    assert variant.ampsafe_normalized == ()  # the variant adds nothing at this setting
    assert registry.setting_safe_reason(PADDLEOCR, "SequenceEncoder", args)


def test_sequence_encoder_cascade_with_linear_gets_its_linears_normalized(ppocr, paddleocr_src):
    import paddle
    import yaml

    rel, maps = cases.OCR_CASCADE
    section = yaml.safe_load((paddleocr_src / "configs" / rel).read_text(encoding="utf-8"))["Architecture"]["Neck"]
    args = {k: v for k, v in section.items() if k != "name"} | {"in_channels": maps[0][0]}
    assert args["encoder_type"].strip() == "cascadernn" and args["with_linear"]
    paddle.seed(0)
    inputs = (paddle.rand([1, *maps[0]]),)
    upstream = ppocr.build_neck({"name": "SequenceEncoder", **copy.deepcopy(args)})
    upstream.eval()
    measured = _check(upstream, inputs)
    assert {measured.ops[p] for p in measured.to_output} == {"linear"}, measured.reason()
    spec = registry.safe_neck(PADDLEOCR, "SequenceEncoder")
    variant = registry.load_class(spec)(**copy.deepcopy(args))
    variant.eval()
    missing, unexpected = _load(variant, upstream)
    assert not unexpected and _check(variant, inputs).safe
    # every stage's linear: the last one's output is the neck's; each earlier one feeds the next LSTM's GEMM
    stages = len(args["out_channels"])
    assert variant.ampsafe_normalized == tuple(f"encoder.encoder.{i}.linear" for i in range(stages))
    assert set(measured.to_output) | set(measured.inner) == set(variant.ampsafe_normalized)
    assert missing == {f"encoder.encoder.{i}.linear.norm.{k}" for i in range(stages) for k in ("weight", "bias")}


def test_swap_refuses_an_rnn_sequence_encoder_with_the_measured_reason_and_swaps_a_linear_one(paddleocr_src, tmp_path):
    from ampsafe.errors import ConfigError
    from ampsafe.patches import swap_neck

    config = paddleocr_src / "configs/rec/rec_mv3_none_bilstm_ctc.yml"
    out = tmp_path / "crnn.yml"
    with pytest.raises(ConfigError, match="nothing to swap") as refused:
        swap_neck(config, out=out)
    assert registry.SETTING_SAFE[(PADDLEOCR, "SequenceEncoder")][1]["rnn"] in str(refused.value)
    assert not out.exists()
    written = swap_neck(paddleocr_src / "configs" / cases.OCR_CASCADE[0], out=tmp_path / "spin.yml")
    assert "name: AmpSafeSequenceEncoder" in written.read_text(encoding="utf-8")
    fc = {"Architecture": {"Neck": {"name": "SequenceEncoder", "encoder_type": "fc", "hidden_size": 96}}}
    assert swap_neck(fc)["Architecture"]["Neck"]["name"] == "AmpSafeSequenceEncoder"
    assert swap_neck(paddleocr_src / "configs" / cases.OCR["PRENFPN"][0], out=tmp_path / "pren.yml").is_file()


# ------------------------------------------------------------------------------------------------- ppdet


@pytest.fixture(scope="module")
def ppdet_zoo(upstream_tree, tmp_path_factory) -> dict:
    """tests/patches/ppdet_neck_zoo.py's JSON, run on PaddleDetection-src when present (else installed ppdet)."""
    from bench.ppocr_optin import write_shim

    src = upstream_tree / "PaddleDetection-src"
    configs = src / "configs" if src.is_dir() else upstream_tree / "PaddleDetection" / "configs"
    shim = write_shim(tmp_path_factory.mktemp("ppdet-shim"))  # numpy.sctypes for the tree's imgaug import
    path = [str(shim), *([str(src)] if src.is_dir() else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "ppdet_neck_zoo.py"), str(configs)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the tree's ppdet prints warnings first
    if src.is_dir():
        assert result["ppdet"] == str(src / "ppdet" / "__init__.py")
    return result


def _record(ppdet_zoo, name: str) -> dict:
    record = ppdet_zoo["necks"][name]
    if record is None:
        pytest.skip(f"{name} (or its config) is not in the ppdet in use, {ppdet_zoo['ppdet']}")
    return record


def _config_necks(configs: Path) -> set[str]:
    """The neck classes the tree's configs name (``neck: Name`` in an architecture section), read from the text."""
    named = re.compile(r"^\s+neck:\s*([A-Za-z_]\w*)\s*$", re.MULTILINE)
    return {n for path in configs.rglob("*.yml") for n in named.findall(path.read_text(encoding="utf-8"))}


def test_the_table_names_exactly_the_necks_ppdet_registers_and_its_configs_name(ppdet_zoo, upstream_tree):
    """ppdet.modeling.necks' classes, and the classes defined elsewhere that a config names as its neck
    (RT-DETR's HybridEncoder and MaskHybridEncoder in ppdet/modeling/transformers, ViTDet's
    SimpleFeaturePyramid in ppdet/modeling/backbones)."""
    src = upstream_tree / "PaddleDetection-src"
    if not src.is_dir():
        pytest.skip("the table is for PaddleDetection's 2024-10 tree (shared/upstream/PaddleDetection-src), absent")
    named = _config_necks(src / "configs")
    modules = ppdet_zoo["modules"]
    outside = {n for n in named if not (modules.get(n) or "").startswith("ppdet.modeling.necks")}
    assert {"HybridEncoder", "MaskHybridEncoder", "SimpleFeaturePyramid"} <= outside
    assert all(modules.get(n) for n in outside), {n: modules.get(n) for n in outside}  # registered, built here
    assert set(_table(PADDLEDET)) == set(ppdet_zoo["registered"]) | outside == set(cases.DET)
    generic = {s.name for s in registry.SAFE_NECKS.values() if s.ecosystem == PADDLEDET}
    assert set(ppdet_zoo["register"]) == generic  # every variant's upstream class is in this ppdet


@pytest.mark.parametrize("name", sorted(n for (e, n) in registry.ALREADY_SAFE if e == PADDLEDET))
def test_ppdet_already_safe_neck_is_measured_safe_for_the_reason_given(ppdet_zoo, name):
    record, detail = _record(ppdet_zoo, name), registry.ALREADY_SAFE[(PADDLEDET, name)]
    assert record["safe"], record["reason"]
    assert bool(record["inner"]) == detail.startswith(registry.INNER_LINKS), (detail, record["inner"])
    if detail.startswith("builds every conv as a conv + ") or "every conv is a conv + " in detail:
        assert record["all_conv_bn"], record["unpaired"]


@pytest.mark.parametrize("name", sorted(s.upstream for s in registry.SAFE_NECKS.values() if s.ecosystem == PADDLEDET))
def test_ppdet_safe_variant_loads_the_upstream_keys_and_checks_safe(ppdet_zoo, name):
    from ampsafe.patches.normed_necks import BN_KEYS

    spec = registry.safe_neck(PADDLEDET, name)
    record = _record(ppdet_zoo, name)
    variant = record["variant"]
    assert not record["safe"] and variant["safe"], (record["reason"], variant["reason"])
    assert variant["class"] == spec.target.replace(":", ".")
    assert not variant["unexpected"] and variant["same_values"]
    assert set(variant["missing"]) == set(variant["new_keys"])
    unnormalized = set(record["to_output"]) | set(record["feeding"])
    if spec.upstream_class:
        assert set(variant["normalized"]) == unnormalized
        assert set(variant["missing"]) == {f"{c}.bn.{k}" for c in unnormalized for k in BN_KEYS}
    else:  # AmpSafeFPN: a sibling <conv>_norm per conv
        assert set(variant["missing"]) == {f"{c}_norm.{k}" for c in unnormalized for k in BN_KEYS}


def test_a_neck_measured_only_on_the_tree_is_not_credited_to_the_installed_ppdet():
    """HybridEncoder and SimpleFeaturePyramid were measured on the 2024-10 tree; the reason says so whichever ppdet
    is installed, and the release it names lacks them (read from the installed package's files, when it is 2.6.0)."""
    import importlib.util

    for name in registry.TREE_ONLY:
        reason = registry.already_safe_reason(PADDLEDET, name)
        assert reason.startswith(f"PaddleDetection's {name} ") and "measured on its 2024-10 tree" in reason
    spec = importlib.util.find_spec("ppdet")
    if spec is None or registry.ppdet_version() != "2.6.0":
        pytest.skip("the installed ppdet is not 2.6.0: its classes are not the ones the reason names")
    sources = "".join(p.read_text(encoding="utf-8") for p in Path(spec.origin).parent.rglob("*.py"))
    assert not any(f"class {name}(" in sources for name in registry.TREE_ONLY)


@pytest.mark.parametrize("name", sorted(n for (e, n) in registry.SETTING_SAFE if e == PADDLEDET))
def test_ppdet_setting_the_swap_refuses_is_measured_safe_for_the_reason_given(ppdet_zoo, name):
    """TTFFPN: unsafe at its default (the variant test), already safe with pafnet_lite's lite_neck, where the
    variant normalizes nothing and the swap refuses with the measured reason."""
    record = ppdet_zoo["settings"][name]
    if record is None:
        pytest.skip(f"{name} (or its config) is not in the ppdet in use, {ppdet_zoo['ppdet']}")
    key, reasons, _ = registry.SETTING_SAFE[(PADDLEDET, name)]
    detail = reasons[str(record["section"][key])]
    assert record["safe"], record["reason"]
    assert bool(record["inner"]) == detail.startswith(registry.INNER_LINKS), (detail, record["inner"])
    if detail.startswith("builds every conv as a conv + "):
        assert record["all_conv_bn"], record["unpaired"]
    assert record["normalized"] == []  # the variant adds nothing at this setting
    assert detail in registry.setting_safe_reason(PADDLEDET, name, record["section"])
    assert registry.setting_safe_reason(PADDLEDET, name, {}) is None  # the default: the variant's setting


def test_swap_refuses_a_lite_ttffpn_with_the_measured_reason_and_swaps_the_default_one(upstream_tree, tmp_path):
    from ampsafe.errors import ConfigError
    from ampsafe.patches import swap_neck

    configs = upstream_tree / "PaddleDetection-src" / "configs"
    if not configs.is_dir():
        pytest.skip("needs PaddleDetection's 2024-10 tree (shared/upstream/PaddleDetection-src)")
    out = tmp_path / "lite.yml"
    with pytest.raises(ConfigError, match="nothing to swap") as refused:
        swap_neck(configs / cases.DET_SETTINGS["TTFFPN"][0], out=out)
    assert registry.SETTING_SAFE[(PADDLEDET, "TTFFPN")][1]["True"] in str(refused.value)
    assert not out.exists()
    written = swap_neck(configs / cases.DET["TTFFPN"][0], out=tmp_path / "ttfnet.yml")
    assert "neck: AmpSafeTTFFPN" in written.read_text(encoding="utf-8")
