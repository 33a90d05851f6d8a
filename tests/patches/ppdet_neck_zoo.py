"""Every neck PaddleDetection registers, built by its own code, checked, and its safe variant loaded: one JSON
document on stdout (test_neck_zoo.py runs this in a subprocess so that the ppdet it reads is the one on
``PYTHONPATH``, the 2024-10 tree when there is one, not whichever ppdet the test process imported first).

    python ppdet_neck_zoo.py CONFIGS_DIR
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import neck_zoo_cases as cases  # noqa: E402


def _plain(value):
    return json.loads(json.dumps(value))


def _section(configs: Path, rel: str, name: str) -> tuple[dict, dict]:
    """(the neck's section, the config's top-level scalars) as ppdet's load_config merges them (_BASE_ included)."""
    from ampsafe.patches.swap import _resolve_ppdet

    if not rel:
        return {}, {}
    cfg = _resolve_ppdet(configs / rel)
    arch = cfg.get(cfg.get("architecture")) or {}
    inline = arch.get("neck") if isinstance(arch.get("neck"), dict) else None  # PETR names its neck inline
    section = {k: v for k, v in (inline or cfg.get(name) or {}).items() if k != "name"}
    top = {k: v for k, v in cfg.items() if not isinstance(v, dict)}
    return _plain(section), _plain({k: v for k, v in top.items() if isinstance(v, (str, int, float, bool))})


def _create(name: str, section: dict, top: dict, maps):
    """ppdet's own ``create``, with the config's section and shared keys in its global config for the call."""
    from ppdet.core.workspace import create, global_config
    from ppdet.modeling.shape_spec import ShapeSpec

    schema = global_config[name]
    shared = {k: top[k] for k in getattr(schema, "shared", None) or () if k in top}
    saved, saved_top = dict(schema), {k: global_config.get(k) for k in shared}
    schema.update(section)
    global_config.update(shared)
    try:
        shapes = [ShapeSpec(channels=c, stride=128 // h) for c, h, _ in maps]
        return create(name, input_shape=shapes)
    finally:
        dict.clear(schema)
        dict.update(schema, saved)
        for k, v in saved_top.items():
            if v is None:
                global_config.pop(k, None)
            else:
                global_config[k] = v


def _inputs(maps):
    import paddle

    paddle.seed(0)
    return ([paddle.rand([1, c, h, w]) for c, h, w in maps],)


def _record(neck, inputs) -> dict:
    from ampsafe.paddle.backend import BACKEND
    from ampsafe.patches.neck_check import check_neck
    from ampsafe.patches.normed_necks import in_conv_norm_block

    neck.eval()
    check = check_neck(neck, ([*inputs[0]],))  # a fresh list: MaskHybridEncoder pops its stride-4 map off it
    parents = {id(c): (p, n) for p in [neck, *neck.sublayers()] for n, c in p.named_children()}
    convs = {p: s for p, s in neck.named_sublayers() if isinstance(s, BACKEND.swaps.convs)}
    unpaired = [p for p, c in convs.items() if not in_conv_norm_block(*parents[id(c)])]
    return {
        "safe": check.safe,
        "to_output": list(check.to_output),
        "feeding": list(check.feeding),
        "inner": list(check.inner),
        "ops": sorted({check.ops[p] for p in check.to_output + check.feeding + check.inner}),
        "all_conv_bn": bool(convs) and not unpaired,
        "unpaired": unpaired,
        "reason": check.reason(),
        "class": f"{type(neck).__module__}.{type(neck).__name__}",
    }


def main(configs: Path) -> dict:
    warnings.filterwarnings("ignore")
    import numpy as np
    import ppdet
    from ppdet.core.workspace import global_config

    from ampsafe.patches import register_paddledet, registry

    registered = sorted(
        k
        for k, v in global_config.items()
        if getattr(getattr(v, "pymodule", None), "__name__", "").startswith("ppdet.modeling.necks")
    )
    modules = {k: getattr(getattr(v, "pymodule", None), "__name__", None) for k, v in global_config.items()}
    out = {"ppdet": ppdet.__file__, "registered": registered, "register": register_paddledet(), "necks": {}}
    out["modules"] = {name: modules.get(name) for name in cases.DET}  # where each neck class is registered from
    for name, (rel, maps) in cases.DET.items():
        if out["modules"][name] is None or (rel and not (configs / rel).is_file()):
            out["necks"][name] = None  # an older ppdet (the installed fallback) or its config copies lack it
            continue
        section, top = _section(configs, rel, name)
        section = {**cases.DET_DEFAULT_ARGS.get(name, {}), **section}
        inputs = _inputs(maps)
        upstream = _create(name, section, top, maps)
        record = _record(upstream, inputs)
        spec = registry.safe_neck(registry.PADDLEDET, name)
        if spec is not None:
            variant = _create(spec.name, section, top, maps)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                missing, unexpected = variant.set_state_dict(upstream.state_dict())
            state = variant.state_dict()
            record["variant"] = {
                **_record(variant, inputs),
                "missing": sorted(missing),
                "unexpected": sorted(unexpected),
                "new_keys": sorted(set(state) - set(upstream.state_dict())),
                "same_values": all(
                    np.array_equal(state[k].numpy(), v.numpy()) for k, v in upstream.state_dict().items()
                ),
                "normalized": list(getattr(variant, "ampsafe_normalized", ())),
            }
        out["necks"][name] = record
    out["settings"] = {}
    for name, (rel, maps) in cases.DET_SETTINGS.items():
        if out["modules"].get(name) is None or not (configs / rel).is_file():
            out["settings"][name] = None
            continue
        section, top = _section(configs, rel, name)
        record = _record(_create(name, section, top, maps), _inputs(maps))
        variant = _create(registry.safe_neck(registry.PADDLEDET, name).name, section, top, maps)
        out["settings"][name] = {**record, "section": section, "normalized": list(variant.ampsafe_normalized)}
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
