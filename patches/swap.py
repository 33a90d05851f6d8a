"""``ampsafe swap-neck``: point a PaddleOCR / PaddleDetection config at the AMP-safe neck, changing nothing else
(but, for a DB head, its float16 black list).

PaddleOCR (``Architecture.Neck.name``, and each ``Architecture.Models.<m>.Neck`` of a distillation config):
the one scalar is replaced *in the original text* at the position the YAML parser reports, so every other
byte (key order, comments, anchors/aliases, even PaddleOCR's duplicate keys, which ruamel would drop on a
round-trip dump while PyYAML keeps the last one) stays as it was. A trailing comment records the old name, and
a comment header (:func:`ocr_header`) says how to run the file: PaddleOCR alone refuses the safe neck's name.

DB heads (``DBHead``, and ``PFHeadLocal``, which subclasses it): the training step function
``reciprocal(1 + exp(-k * (x - y)))`` (k=50) runs ``exp`` in float16 at AMP level O2 (Paddle's float16 black
list has ``exp`` at O1 only) and overflows. Measured with PaddleOCR's tools/train.py (det_mv3_db, 30 steps,
bench/results/ppocr_optin.md): the swapped config had 0 overflowing steps at O1 but overflowed from step 0 at
O2; with ``Global.amp_custom_black_list: ['exp']`` (tools/train.py passes it to ``paddle.amp.auto_cast``) 0 at
O2 too. So the swap also makes that list contain ``exp`` (a no-op at O1): one line added after Global's last
key when absent, ``exp`` added before the ``]`` of a one-line flow list or as a ``- exp`` line after a block
list's last item, nothing when listed: edited in the text, with an ``# ampsafe:`` comment, and checked with
PyYAML to change that list only. A config without ``Global``: nothing added, the change lines say so.

PaddleDetection: ``_BASE_`` includes are followed to find ``architecture`` and its ``neck``; the output is a
small overlay that ``_BASE_``-includes the original file (not a flattened copy) and overrides the neck name
and its section, so upstream edits to the base files still apply.

Refused with :class:`ampsafe.ConfigError`, nothing written: a neck without a safe variant (the supported ones
are listed), a neck that needs none (the evidence is given), a neck whose variant adds nothing at its config's
setting (SequenceEncoder with ``encoder_type: rnn``: the measured reason is given), an already swapped config, a non-YAML file, a
config without an architecture section, ``mode`` other than ``convbn``, a DB head's black list that cannot
take ``exp`` in place (not a list, a multi-line flow list, a duplicate key: the message says what to add).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

from ampsafe.errors import ConfigError

from . import registry
from .registry import PADDLEDET, PADDLEOCR

__all__ = ["swap_neck", "main", "MODES"]

MODES = ("convbn",)

_ISLAND_REFUSAL = (
    "mode 'island' is not offered by the config swap: measured on a DBNet-like model, the float16 overflow "
    "happens in the head's first conv, outside the neck, so an FP32 island confined to the neck does not fix it "
    "(111 of 120 steps still overflowed). Islands are ampsafe.patch(model)'s job: it islands the risky paths "
    "wherever they are (head included). Use --mode convbn here (BatchNorm after each neck conv, so the head "
    "receives normalized features)."
)
_RESCALE_REFUSAL = (
    "mode 'rescale' is not offered by the config swap: an exact rescale must be compensated at the BatchNorm "
    "that ends the path, and for the neck those BatchNorms are in the head, which the swap does not touch, so "
    "eval outputs of a loaded upstream checkpoint would change. ampsafe.patch(model, policy='rescale') rewrites "
    "whole models exactly. Use --mode convbn here."
)


def _check_mode(mode: str) -> None:
    if mode == "island":
        raise ConfigError(_ISLAND_REFUSAL)
    if mode == "rescale":
        raise ConfigError(_RESCALE_REFUSAL)
    if mode not in MODES:
        raise ConfigError(f"unknown swap mode {mode!r}; the config swap supports: {', '.join(MODES)}")


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip: keeps line/column info, comments, anchors, unknown tags (!PiecewiseDecay)
    yaml.allow_duplicate_keys = True  # PaddleOCR configs contain some; PyYAML (what they use) keeps the last
    return yaml


def _load(path: Path):
    if path.suffix.lower() not in {".yml", ".yaml"}:
        raise ConfigError(f"{path} is not a YAML file (expected .yml or .yaml); nothing written")
    if not path.is_file():
        raise ConfigError(f"config {path} does not exist; nothing written")
    try:
        data = _yaml().load(path.read_text(encoding="utf-8"))
    except Exception as exc:  # ruamel raises many parser/scanner error types
        raise ConfigError(f"{path} is not valid YAML ({type(exc).__name__}: {exc}); nothing written") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} is not a YAML mapping of config sections; nothing written")
    return data


def _supported_text(ecosystem: str) -> str:
    return ", ".join(registry.supported(ecosystem))


# ------------------------------------------------------------------------------------------------- PaddleOCR


def _ocr_necks(arch: Mapping) -> list[tuple[str, Mapping]]:
    """(where, neck mapping) for the plain and the distillation layouts."""
    found = []
    if isinstance(arch.get("Neck"), Mapping):
        found.append(("Architecture.Neck", arch["Neck"]))
    models = arch.get("Models")
    if isinstance(models, Mapping):
        for model_name, model in models.items():
            if isinstance(model, Mapping) and isinstance(model.get("Neck"), Mapping):
                found.append((f"Architecture.Models.{model_name}.Neck", model["Neck"]))
    return found


def _plan_ocr(arch: Mapping, source: str) -> list[tuple[str, Mapping, str, str]]:
    """The swaps to make: (where, neck mapping, old name, new name); refuses when there is nothing to do."""
    necks = _ocr_necks(arch)
    if not necks:
        raise ConfigError(
            f"{source}: Architecture has no Neck section (a recognition or non-DB model?); the swap rewrites "
            f"DB-family necks: {_supported_text(PADDLEOCR)}. Nothing written."
        )
    names = [(where, neck, str(neck.get("name"))) for where, neck in necks]
    swapped = [f"{where}.name: {name}" for where, _, name in names if name in registry.safe_names(PADDLEOCR)]
    if swapped:
        raise ConfigError(f"{source} is already swapped ({'; '.join(swapped)}); nothing written")
    plan = []
    for where, neck, name in names:
        spec = registry.safe_neck(PADDLEOCR, name)
        if spec is not None and registry.setting_safe_reason(PADDLEOCR, name, neck) is None:
            plan.append((where, neck, name, spec.name))
    if not plan:
        listed = ", ".join(f"{where}.name: {name}" for where, _, name in names)
        reasons = dict.fromkeys(
            r
            for _, neck, name in names
            for r in (
                registry.already_safe_reason(PADDLEOCR, name),
                registry.not_covered_reason(PADDLEOCR, name),
                registry.setting_safe_reason(PADDLEOCR, name, neck),
            )
            if r
        )
        why = "".join(f" {r}." for r in reasons)
        if all(registry.safe_neck(PADDLEOCR, name) is not None for _, _, name in names):  # variants, nothing to add
            raise ConfigError(f"{source}: nothing to swap for {listed}.{why} Nothing written.")
        raise ConfigError(
            f"{source}: no safe variant for {listed}.{why} Necks with an AMP-safe variant: "
            f"{_supported_text(PADDLEOCR)} (`ampsafe swap-neck --list` says why for every neck). For other models use "
            "ampsafe.patch(model) or `ampsafe run` (loss-scale floor). Nothing written."
        )
    return plan


def _replace_scalar(line: str, col: int, old: str, new: str, note: str) -> str:
    match = re.compile(r"([\"']?)" + re.escape(old) + r"\1").match(line, col)
    if match is None:
        raise ConfigError(f"could not find {old!r} at column {col} of line {line!r}; nothing written")
    rest = line[match.end() :]
    comment = "" if "#" in rest else f"  # {note}"
    quote = match.group(1)  # keep the scalar's quoting style
    return (
        line[: match.start()] + quote + new + quote + rest.rstrip("\r\n") + comment + line[len(line.rstrip("\r\n")) :]
    )


def _swap_ocr_file(path: Path, data: Mapping, mode: str) -> tuple[str, list[tuple[str, str]]]:
    plan = _plan_ocr(data["Architecture"], str(path))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for _where, neck, old, new in plan:
        line_no, col = neck.lc.value("name")
        note = f"ampsafe swap-neck ({mode}): was {old}"
        lines[line_no] = _replace_scalar(lines[line_no], col, old, new, note)
    changes = [(where, f"{old} -> {new}") for where, _, old, new in plan]
    heads = _exp_step_heads(data["Architecture"])
    if heads:
        change = _black_list_exp(lines, data, heads, {neck.lc.value("name")[0] for _, neck, _, _ in plan}, str(path))
        if change is not None:
            changes.append(change)
    return ocr_header(mode, [(old, new) for _, _, old, new in plan]) + "".join(lines), changes


def ocr_header(mode: str, swaps: list[tuple[str, str]]) -> str:
    """The comment a swapped PaddleOCR config starts with: PaddleOCR's builder refuses a neck it does not know
    (``AssertionError: neck only support [...]``), so the file says how to run it."""
    names = ", ".join(f"{old} -> {new}" for old, new in dict.fromkeys(swaps))
    return (
        f"# Written by `ampsafe swap-neck --mode {mode}` ({names}); the rest is the original file, unchanged.\n"
        "# PaddleOCR must know the safe neck before it builds the model: run training as\n"
        "#   ampsafe run -- python tools/train.py -c THIS_FILE\n"
        "# or `import ampsafe.patches` (it registers the safe necks) before ppocr's build_model is called.\n"
    )


# PaddleOCR heads whose training forward runs DBHead.step_function, reciprocal(1 + exp(-k * (x - y))) with k=50
# (ppocr/modeling/heads/det_db_head.py: PFHeadLocal subclasses DBHead and calls the same step_function).
_EXP_STEP_HEADS = ("DBHead", "PFHeadLocal")
_BLACK_LIST = "amp_custom_black_list"  # PaddleOCR's tools/train.py: paddle.amp.auto_cast(custom_black_list=...)
_BLACK_WHERE = f"Global.{_BLACK_LIST}"


def _exp_step_heads(arch: Mapping) -> list[str]:
    """The DB-family head names (plain and distillation layouts) whose step function runs exp."""
    heads = [arch.get("Head")]
    models = arch.get("Models")
    if isinstance(models, Mapping):
        heads += [m.get("Head") for m in models.values() if isinstance(m, Mapping)]
    names = [str(h.get("name")) for h in heads if isinstance(h, Mapping)]
    return sorted({n for n in names if n in _EXP_STEP_HEADS})


def _exp_reason(heads: list[str]) -> str:
    return f"{'/'.join(heads)}'s step-function exp overflows float16 at O2"


def _no_global(heads: list[str]) -> tuple[str, str]:
    return (
        _BLACK_WHERE,
        f"not added, the config has no Global section; for AMP O2 add `amp_custom_black_list: ['exp']` under "
        f"Global by hand ({_exp_reason(heads)})",
    )


def _by_hand(source: str, why: str, heads: list[str]) -> ConfigError:
    return ConfigError(
        f"{source}: could not add exp to {_BLACK_WHERE} in place ({why}); add it by hand, e.g. "
        f"`{_BLACK_LIST}: [..., exp]` under Global ({_exp_reason(heads)}); nothing written"
    )


def _pyyaml(text: str, source: str):
    """The config as PaddleOCR's loader (PyYAML: the last duplicate key wins) reads it; tags are kept as plain
    data (nothing is constructed from them)."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def _plain(loader, _suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _Loader.add_multi_constructor("", _plain)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: PyYAML (PaddleOCR's loader) cannot read it ({exc}); nothing written") from exc


def _flow_end(line: str, start: int) -> int | None:
    """Index of the ``]`` closing the flow sequence that opens at ``line[start]``, or None (not on this line)."""
    depth, quote, i = 0, "", start
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == quote and quote == "'" and line[i + 1 : i + 2] == "'":
                i += 1  # '' is an escaped quote inside '...'
            elif ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return i if ch == "]" else None
        i += 1
    return None


def _eol(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :] or "\n"


def _black_list_exp(
    lines: list[str], data: Mapping, heads: list[str], neck_lines: set[int], source: str
) -> tuple[str, str] | None:
    """Make ``Global.amp_custom_black_list`` contain exp, editing ``lines`` in place (one line inserted or one
    item added; the line count of ``lines`` is kept: an inserted line joins the one before it). Returns the
    change line, or None when exp is already listed."""
    before = "".join(lines)
    seen = _pyyaml(before, source)  # what PaddleOCR reads (a duplicate key: the last one)
    glob = data.get("Global")
    if not isinstance(seen, Mapping) or not isinstance(seen.get("Global"), Mapping) or not isinstance(glob, Mapping):
        return _no_global(heads)
    listed = seen["Global"].get(_BLACK_LIST, None)
    if isinstance(listed, list) and "exp" in listed:
        return None
    if glob.fa.flow_style():
        raise _by_hand(source, "Global is a flow-style mapping", heads)
    comment = f"  # ampsafe: {_exp_reason(heads)}"
    if _BLACK_LIST not in seen["Global"]:
        # after the last line of the Global mapping that is not blank or a comment (a comment there may head the
        # next section), at the indentation of Global's keys
        g_line = data.lc.key("Global")[0]
        end = min([data.lc.key(k)[0] for k in data if data.lc.key(k)[0] > g_line], default=len(lines))
        content = [i for i in range(g_line + 1, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")]
        indent = glob.lc.key(next(iter(glob)))[1] if len(glob) else 0
        if not content or indent == 0:
            raise _by_hand(source, "Global has no indented keys", heads)
        at = content[-1]
        line = f"{' ' * indent}{_BLACK_LIST}: ['exp']{comment}"
        expected = ["exp"]
    else:
        value = glob.get(_BLACK_LIST)
        if not isinstance(listed, list) or not isinstance(value, list):
            raise _by_hand(source, f"its value {listed!r} is not a list", heads)
        at, start = glob.lc.value(_BLACK_LIST)
        if lines[at][start : start + 1] == "[":  # flow style (ruamel reports no flow style for an empty one)
            close = _flow_end(lines[at], start) if at not in neck_lines else None
            if close is None:
                raise _by_hand(source, "the flow-style list does not end on its first line", heads)
            text = lines[at]
            inner = text[start + 1 : close]
            quote = next((q for q in "'\"" if inner.strip().startswith(q)), "")
            kept = inner.rstrip()
            spaced = ", " in inner or len(value) < 2
            sep = ("" if not kept or kept.endswith(",") else ",") + (" " if kept and spaced else "") + quote
            cut = start + 1 + len(kept)
            rest = text[close:].rstrip("\r\n")
            lines[at] = text[:cut] + sep + "exp" + quote + rest + ("" if "#" in rest else comment) + _eol(text)
            at = None
        else:
            at, col = value.lc.item(len(value) - 1) if value else (start, 0)
            dash = lines[at].rfind("-", 0, col)
            if not value or not isinstance(value[-1], str) or dash < 0 or lines[at][:dash].strip() or at in neck_lines:
                raise _by_hand(source, "its last item is not a one-line `- name` entry", heads)
            line = f"{lines[at][:dash]}- exp{comment}"
        expected = [*listed, "exp"]
    if at is not None:
        if not lines[at].endswith(("\n", "\r")):
            lines[at] += "\n"  # the file ended without a newline right there
        lines[at] += line + _eol(lines[at])
    # the edit must change exactly that for PaddleOCR's loader (a duplicate key, a block scalar: refused)
    after = _pyyaml("".join(lines), source)
    want = {**seen, "Global": {**seen["Global"], _BLACK_LIST: expected}}
    if after != want:
        raise _by_hand(source, "an in-place edit would change more than that list (a duplicate key?)", heads)
    return _BLACK_WHERE, f"+ exp ({_exp_reason(heads)})"


# ------------------------------------------------------------------------------------------------- ppdet


def _merge(base: dict, over: Mapping) -> dict:
    """ppdet's merge: nested mappings merge key by key, everything else in ``over`` replaces."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            base[key] = _merge(dict(base[key]), value)
        else:
            base[key] = value
    return base


def _resolve_ppdet(path: Path, seen: tuple = ()) -> dict:
    """The config as ppdet's load_config sees it: _BASE_ files merged in order, the file itself on top."""
    if path in seen:
        raise ConfigError(f"_BASE_ include cycle through {path}; nothing written")
    data = _load(path)
    merged: dict = {}
    for base in data.get("_BASE_", None) or []:
        base_path = Path(os.path.expanduser(str(base)))
        if not base_path.is_absolute():
            base_path = path.parent / base_path
        if not base_path.is_file():
            raise ConfigError(f"{path}: _BASE_ file {base} not found (looked at {base_path}); nothing written")
        merged = _merge(merged, _resolve_ppdet(base_path, (*seen, path)))
    return _merge(merged, {k: v for k, v in data.items() if k != "_BASE_"})


def _plan_ppdet(cfg: Mapping, source: str) -> tuple[str, str, str, Mapping]:
    """(architecture, old neck, new neck, old neck's section) or a refusal."""
    arch = cfg.get("architecture")
    if not arch:
        raise ConfigError(
            f"{source} has no architecture section (not a model config, or its _BASE_ files don't define "
            "`architecture:`); pass the model's config. Nothing written."
        )
    section = cfg.get(arch)
    if not isinstance(section, Mapping) or "neck" not in section:
        raise ConfigError(f"{source}: architecture {arch} has no `neck:` entry; nothing written")
    neck = str(section["neck"])
    if neck in registry.safe_names(PADDLEDET):
        raise ConfigError(f"{source} is already swapped ({arch}.neck: {neck}); nothing written")
    reason = registry.already_safe_reason(PADDLEDET, neck) or registry.setting_safe_reason(
        PADDLEDET, neck, cfg.get(neck) or {}
    )
    if reason is not None:
        raise ConfigError(f"{source}: nothing to swap for {arch}.neck: {neck}. {reason}. Nothing written.")
    spec = registry.safe_neck(PADDLEDET, neck)
    if spec is None:
        raise ConfigError(
            f"{source}: no safe variant for {arch}.neck: {neck}; PaddleDetection necks with an AMP-safe variant: "
            f"{_supported_text(PADDLEDET)} (needing none: {', '.join(sorted(n for _, n in registry.ALREADY_SAFE))}). "
            "Nothing written."
        )
    return arch, neck, spec.name, cfg.get(neck) or {}


def _overlay_text(original: Path, out: Path, arch: str, old: str, new: str, neck_section: Mapping, mode: str) -> str:
    from io import StringIO

    from ruamel.yaml.comments import CommentedMap

    original, out_dir = original.resolve(), out.resolve().parent
    # relative when both live in one tree (the overlay can move with it), absolute otherwise
    same_tree = os.path.commonpath([original, out_dir]) != original.anchor
    rel = os.path.relpath(original, out_dir) if same_tree else str(original)
    doc = CommentedMap()
    doc["_BASE_"] = [rel]
    doc[arch] = CommentedMap(neck=new)
    doc[new] = CommentedMap(copy.deepcopy(dict(neck_section)))
    doc.yaml_set_comment_before_after_key(new, before=f"{old}'s settings, for the safe variant")
    buf = StringIO()
    _yaml().dump(doc, buf)
    header = (
        f"# Written by `ampsafe swap-neck --mode {mode}`: {arch}.neck {old} -> {new}; everything else comes from\n"
        f"# the _BASE_ file, unchanged. ppdet must know {new} before it reads this file: run training as\n"
        "#   ampsafe run -- python tools/train.py -c THIS_FILE\n"
        "# or call ampsafe.patches.register_paddledet() first.\n"
    )
    return header + buf.getvalue()


# ------------------------------------------------------------------------------------------------- API


def _default_out(path: Path) -> Path:
    return path.with_name(f"{path.stem}_ampsafe{path.suffix}")


def _swap_file(path: Path, mode: str, out: Path | None) -> tuple[Path, list[tuple[str, str]]]:
    """Writes the swapped config; returns where and the changes, as (where, what) pairs."""
    data = _load(path)
    out = Path(out) if out is not None else _default_out(path)
    if out.resolve() == path.resolve():
        raise ConfigError(f"output {out} is the input file; choose another -o (the original is kept); nothing written")
    if "Architecture" in data:
        text, changes = _swap_ocr_file(path, data, mode)
    elif "architecture" in data or "_BASE_" in data:
        arch, old, new, section = _plan_ppdet(_resolve_ppdet(path), str(path))
        text = _overlay_text(path, out, arch, old, new, section, mode)
        changes = [(f"{arch}.neck", f"{old} -> {new}")]
    else:
        raise ConfigError(
            f"{path} has no architecture section (neither PaddleOCR's `Architecture:` nor PaddleDetection's "
            "`architecture:` / `_BASE_`); nothing written"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out, changes


def _black_list_exp_dict(cfg: dict, heads: list[str]) -> None:
    glob = cfg.get("Global")
    if not isinstance(glob, Mapping):
        warnings.warn(f"{_BLACK_WHERE}: {_no_global(heads)[1]}", UserWarning, stacklevel=4)
        return
    listed = glob.get(_BLACK_LIST, [])
    if not isinstance(listed, (list, tuple)):
        raise ConfigError(
            f"config: {_BLACK_WHERE} is {listed!r}, not a list; make it a list that contains exp "
            f"({_exp_reason(heads)}). Nothing changed."
        )
    if "exp" not in listed:
        cfg["Global"] = {**glob, _BLACK_LIST: [*listed, "exp"]}


def _swap_dict(config: Mapping) -> dict:
    cfg = copy.deepcopy(dict(config))
    if "Architecture" in cfg:
        cfg["Architecture"] = copy.deepcopy(cfg["Architecture"])
        for _where, neck, _old, new in _plan_ocr(cfg["Architecture"], "config"):
            neck["name"] = new
        heads = _exp_step_heads(cfg["Architecture"])
        if heads:
            _black_list_exp_dict(cfg, heads)
        return cfg
    if "architecture" in cfg:
        arch, _old, new, section = _plan_ppdet(cfg, "config")
        cfg[arch] = {**cfg[arch], "neck": new}
        cfg[new] = copy.deepcopy(dict(section))
        return cfg
    if "_BASE_" in cfg:
        raise ConfigError("a ppdet config dict with _BASE_ includes: pass the file's path so the includes can be read")
    raise ConfigError("config has no architecture section (PaddleOCR `Architecture` or ppdet `architecture`)")


def swap_neck(config, *, mode: str = "convbn", out: str | os.PathLike | None = None):
    """Rewrite a config to use the AMP-safe neck.

    ``config``: a dict (returns a rewritten copy) or a path (writes ``out``, by default ``<name>_ampsafe.yml``
    next to it, and returns that path). Raises :class:`ampsafe.ConfigError` and writes nothing when it refuses.
    """
    _check_mode(mode)
    if isinstance(config, Mapping):
        return _swap_dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"swap_neck takes a config dict or a path, got {type(config).__name__}")
    return _swap_file(Path(config), mode, out)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ampsafe swap-neck",
        description="Rewrite a PaddleOCR / PaddleDetection config to the AMP-safe neck (BatchNorm after each conv).",
    )
    parser.add_argument("config", nargs="?", help="the config .yml to read (never modified)")
    parser.add_argument(
        "--list",
        action="store_true",
        help="print every PaddleOCR / PaddleDetection neck class: safe variant, already safe (why) or not covered (why)",
    )
    parser.add_argument("-o", "--output", help="where to write (default: <name>_ampsafe.yml next to the input)")
    parser.add_argument("--mode", default="convbn", help="convbn (the only mode the swap offers)")
    args = parser.parse_args(argv)
    if args.list:
        print(registry.render_neck_table())
        return 0
    if args.config is None:
        parser.error("a config is needed (or --list)")
    _check_mode(args.mode)
    written, changes = _swap_file(Path(args.config), args.mode, Path(args.output) if args.output else None)
    for where, what in changes:
        print(f"{where}: {what}")
    print(f"wrote {written}")
    return 0
