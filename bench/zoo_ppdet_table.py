"""bench/results/zoo-ppdet.md from bench/results/zoo-ppdet.json: one table, the signature accounting, and a short
paragraph of measured facts (computed from the rows, nothing typed in by hand).

The neck status is read from ``patches/registry.py`` when the page is rendered, not frozen in the JSON, so the page
follows the registry when a neck variant is added (re-run ``python -m bench.zoo_ppdet --render``).
"""

from __future__ import annotations

__all__ = ["render", "neck_status", "train_note", "norm_note"]


def neck_status(neck: str | None) -> str | None:
    """What patches/registry.py says of ``neck`` now: a safe variant, already safe (why), or not covered."""
    if not neck:
        return None
    from ampsafe.patches.registry import ALREADY_SAFE, NOT_COVERED, PADDLEDET, safe_neck

    spec = safe_neck(PADDLEDET, neck)
    if spec is not None:
        return f"safe variant registered ({spec.name})"
    detail = ALREADY_SAFE.get((PADDLEDET, neck))
    if detail is not None:
        return f"already safe: {detail}"
    why = NOT_COVERED.get((PADDLEDET, neck))
    return "not covered" if why is None else f"not covered: {why}"


def norm_note(row: dict) -> str:
    """What the overlay did to the classes that freeze their BatchNorms: ``freeze_norm: false`` (no pretrained
    statistics to freeze), or, for a row scanned (or trained) before it did, that those ran frozen at their initial
    statistics, identities (bench/zoo_ppdet.py's module doc)."""
    train = row.get("train") or {}
    frozen = row.get("frozen_at_init") or []
    unfrozen = sorted({*(row.get("unfrozen_norms") or []), *(train.get("unfrozen_norms") or [])})
    notes = []
    if frozen:
        runs = "scan" + (" and runs" if train and "unfrozen_norms" not in train else "")
        names = ", ".join(p.split(".")[0] for p in frozen)
        notes.append(f"{runs} with {names}'s BatchNorms frozen at their initial statistics (identities)")
    if unfrozen:
        notes.append("freeze_norm: false for " + ", ".join(p.split(".")[0] for p in unfrozen))
    return "; ".join(notes)


def _num(x, spec=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e7:
        return str(int(x))
    return format(x, spec) if isinstance(x, float) else str(x)


def _scan_cell(scan: dict | None, level: str, usual: str) -> str:
    """A scan's risky paths and least headroom, and its input where it is not ``usual`` (the sweep's size)."""
    s = (scan or {}).get(level)
    if not s:
        return "-"
    shape = f" (input {s['input']})" if s.get("input") and s["input"] != usual else ""
    if "error" in s:
        at = f" (raised at `{s['raised_at']}`)" if s.get("raised_at") else ""
        return f"scan error: {s['error'][:80]}{at}{shape}"
    where = f" @ `{s['where']}`" if s.get("where") else ""
    ops = f"; {s['risky_ops']} risky op(s), least `{s['risky_op_where']}`" if s.get("risky_ops") else ""
    return f"{s['risky_paths']} risky / {s['paths']} paths; least {_num(s['least_headroom'])} bits{where}{ops}{shape}"


def train_note(row: dict) -> str | None:
    """Why a row was not trained (None when it was)."""
    if row.get("train"):
        return None
    if row.get("built") is False:
        return "not trained: does not build"
    if not row.get("scan"):
        return f"not trained: {row.get('why_not') or 'not scanned'}"
    return "not trained: time budget"


def _run_cell(run: dict | None) -> str:
    if not run:
        return "-"
    over = run.get("overflow_steps") or []
    if run.get("overflow_steps") is None:
        text = "overflows unknown (no report.json); "
    else:
        text = f"{len(over)} overflowing{' ' + str(over) if over else ''}; scale {_num(run.get('final_scale'))}; "
    text += f"loss {_num(run.get('loss_first'))} → {_num(run.get('loss_last'))}"
    text += "" if run.get("finite") else " **non-finite**"
    if run.get("steps_run") is not None:
        text += f"; {run['steps_run']} steps"
    if run.get("returncode"):
        text += f"; exit {run['returncode']}: {(run.get('error') or '')[:100]}"
    heals = run.get("heals")
    if heals:
        text += "; heals: " + ", ".join(f"step {h['step']}: `{', '.join(h['islanded'][:3])}`" for h in heals)
    elif heals is not None:
        text += "; no heal"
    return text


def _wall(row: dict) -> str:
    w = row.get("wall_s") or {}
    parts = [f"{k} {_num(w[k])}" for k in ("build+scan total", "native", "ampsafe") if k in w]
    return ", ".join(parts) or "-"


def _total_wall(rows: list[dict], key: str | None = None) -> float:
    keys = (key,) if key else ("build+scan total", "native", "ampsafe")
    return float(sum((r.get("wall_s") or {}).get(k, 0) for r in rows for k in keys))


def _table(doc: dict) -> list[str]:
    counts = {s["chosen"]: s["count"] for s in doc.get("signatures", [])}
    head = (
        "config (configs/)", "family", "configs with this signature", "architecture / backbone / head", "neck",
        "neck status (patches/registry.py)", "built", "scan O1", "scan O2", "native (Paddle's GradScaler)",
        "`ampsafe run --emulate-fp16`", "wall s",
    )  # fmt: skip
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    usual = f"{doc.get('batch', 2)}x3x{doc.get('size', 320)}x{doc.get('size', 320)}"
    for row in doc["rows"]:
        train = row.get("train") or {}
        note = train_note(row)
        built = {True: "yes", False: "**no**", None: "?"}[row.get("built")]
        if row.get("why_not"):
            built += f": {row['why_not'][:140]}"
        cells = [
            f"`{row['config']}`"
            + (f" (data and reader of `{row['data_from']}`)" if row.get("data_from") else "")
            + (f" ({norms})" if (norms := norm_note(row)) else ""),
            row["family"],
            str(counts.get(row["config"], "-")),
            f"{row['architecture']} / {row['backbone']} / {row['head']}",
            row.get("neck") or "-",
            neck_status(row.get("neck")) or "-",
            built,
            _scan_cell(row.get("scan"), "O1", usual),
            _scan_cell(row.get("scan"), "O2", usual),
            note or _run_cell(train.get("native")),
            "" if note else _run_cell(train.get("ampsafe")),
            _wall(row),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def _accounting(doc: dict) -> list[str]:
    sigs = doc.get("signatures", [])
    done = {r["config"] for r in doc["rows"]}
    total = sum(s["count"] for s in sigs)
    fragments, errors = doc.get("fragments", []), doc.get("load_errors", {})
    lines = [
        "",
        "## Every config, by signature",
        "",
        f"{total + len(fragments) + len(errors)} .yml files under configs/: {total} model configs in {len(sigs)} "
        f"signatures (architecture + backbone + neck + head class, from ppdet's merged config), {len(fragments)} "
        f"fragments without an `architecture` (`_base_/` parts, datasets, readers, runtime) and {len(errors)} that "
        "ppdet's `load_config` refuses here (first line of the error below). A signature's row is its chosen config "
        "(a COCO one, then the shortest name); a signature without a row was not reached in the time budget.",
        "",
        "| signature (architecture / backbone / neck / head) | family | configs | chosen | row |",
        "|---|---|---|---|---|",
    ]
    for s in sigs:
        arch, backbone, neck, head = s["signature"]
        lines.append(
            f"| {arch} / {backbone} / {neck} / {head} | {s['family']} | {s['count']} | `{s['chosen']}` | "
            f"{'yes' if s['chosen'] in done else 'not reached: time budget'} |"
        )
    if errors:
        lines += ["", "Not loadable here:", ""]
        lines += [f"- `{c}`: {e}" for c, e in sorted(errors.items())]
    members = ["", "<details><summary>the configs of each signature</summary>", ""]
    for s in sigs:
        members.append(f"- {' / '.join(str(x) for x in s['signature'])}: " + ", ".join(f"`{c}`" for c in s["configs"]))
    return lines + members + ["", "</details>"]


def _facts(doc: dict) -> list[str]:
    rows = doc["rows"]
    built = [r for r in rows if r.get("built")]
    unbuilt = [r for r in rows if r.get("built") is False]
    scanned = [r for r in rows if r.get("scan") and "error" not in (r["scan"].get("O1") or {"error": 1})]
    risky = {lvl: [r for r in scanned if (r["scan"].get(lvl) or {}).get("risky_paths")] for lvl in ("O1", "O2")}
    trained = [r for r in rows if r.get("train")]
    native_over = [r for r in trained if (r["train"].get("native") or {}).get("overflow_steps")]
    amp_over = [r for r in trained if (r["train"].get("ampsafe") or {}).get("overflow_steps")]
    healed = [r for r in trained if (r["train"].get("ampsafe") or {}).get("heals")]
    nonfinite = [
        (r["config"], run)
        for r in trained
        for run in ("native", "ampsafe")
        if r["train"].get(run) and not r["train"][run].get("finite")
    ]
    least = min(
        ((r["scan"]["O1"]["least_headroom"], r["config"], r["scan"]["O1"]["where"]) for r in scanned
         if r["scan"]["O1"].get("least_headroom") is not None),
        default=None,
    )  # fmt: skip
    text = (
        f"Measured: {len(rows)} signatures reached, {len(built)} built on this CPU, {len(unbuilt)} did not build; "
        f"{len(scanned)} scanned: {len(risky['O1'])} with a risky path at O1 "
        f"({', '.join('`' + r['config'] + '`' for r in risky['O1']) or 'none'}), {len(risky['O2'])} at O2. "
    )
    if least:
        text += f"Least O1 headroom: {least[0]} bits at `{least[2]}` in `{least[1]}`. "
    text += (
        f"{len(trained)} trained {doc['K']} steps: {len(native_over)} overflowed under Paddle's own scaler "
        f"({', '.join('`' + r['config'] + '`' for r in native_over) or 'none'}), {len(amp_over)} under ampsafe, "
        f"{len(healed)} healed"
    )
    if healed:
        text += " (" + "; ".join(
            f"`{r['config']}`: " + ", ".join(
                f"`{p}`" for h in r["train"]["ampsafe"]["heals"] for p in h["islanded"][:3]
            )
            for r in healed
        ) + ")"  # fmt: skip
    text += f"; non-finite losses: {', '.join(f'`{c}` ({run})' for c, run in nonfinite) or 'none'}."
    failed = [(r["config"], run) for r in trained for run in ("native", "ampsafe") if r["train"][run].get("returncode")]
    if failed:
        text += " Runs that exited before K steps: " + "; ".join(
            f"`{c}` {run} after {r_steps} step(s), {_first_error(rows, c, run)}" for c, run, r_steps in
            ((c, run, next(r for r in rows if r["config"] == c)["train"][run].get("steps_run")) for c, run in failed)
        ) + "."  # fmt: skip
    for r in trained:
        native, amp = r["train"]["native"], r["train"]["ampsafe"]
        if native.get("losses") and amp.get("losses") and native["losses"] != amp["losses"]:
            text += (
                f" `{r['config']}` per-step losses, native: {', '.join(_num(v) for v in native['losses'])}; "
                f"under ampsafe: {', '.join(_num(v) for v in amp['losses'])}."
            )
    for r in rows:
        before = r.get("frozen_at_init_run")  # the row as measured before the overlay unfroze its norms
        if before:
            scan, train = (before.get("scan") or {}).get("O1") or {}, before.get("train") or {}
            runs = "; ".join(
                f"{run}: loss {_num((train.get(run) or {}).get('loss_first'))} → "
                f"{_num((train.get(run) or {}).get('loss_last'))}, "
                f"{len((train.get(run) or {}).get('overflow_steps') or [])} overflowing step(s)"
                + (f", {len(train[run]['heals'])} heal(s)" if (train.get(run) or {}).get("heals") else "")
                for run in ("native", "ampsafe")
                if train.get(run)
            )
            text += (
                f" `{r['config']}` measured before with {', '.join(before['frozen'])}'s BatchNorms frozen at their "
                f"initial statistics (identities): O1 scan {scan.get('risky_paths')} risky path(s), least "
                f"{_num(scan.get('least_headroom'))} bits at `{scan.get('where')}`; {runs}."
            )
        if r.get("fp32"):
            f = r["fp32"]
            text += (
                f" `{r['config']}` without `--amp` (float32, same overlay and seed): exit {f.get('returncode')}, "
                f"{f.get('steps_run')} steps, losses {', '.join(_num(v) for v in f.get('losses') or [])}."
            )
    return ["", text]


def _first_error(rows: list[dict], config: str, run: str) -> str:
    row = next(r for r in rows if r["config"] == config)
    error = (row["train"][run].get("error") or "").strip()
    return f"`{error[:160]}`" if error else "no error line"


def render(doc: dict) -> str:
    m = doc.get("machine", {})
    rows = doc["rows"]
    lines = [
        "# The zoo: PaddleDetection",
        "",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores shared with other jobs (timings are load-inflated), "
        f"{m.get('threads', '1')} thread per run; {m.get('date')}; ampsafe {m.get('git commit')}; tree "
        f"{m.get('ppdet tree')} on `PYTHONPATH` ahead of the installed paddledet. Wall time, all rows: "
        f"{_num(_total_wall(rows), '.0f')} s (build + scan {_num(_total_wall(rows, 'build+scan total'), '.0f')} s, "
        f"training {_num(_total_wall(rows, 'native') + _total_wall(rows, 'ampsafe'), '.0f')} s).",
        "",
        f"Each row: the signature's chosen config built by ppdet's `load_config` + `create(cfg.architecture)`; "
        f"`ampsafe.scan` of the train-mode forward at O1 and O2 on one batch of the config's own TrainReader "
        f"transforms ({doc.get('batch', 2)} synthetic images, resize targets set to {doc.get('size', 320)}, so "
        f"`image` {doc.get('batch', 2)}x3x{doc.get('size', 320)}x{doc.get('size', 320)} with the reader's "
        "`im_shape` / `scale_factor` / targets, where the transforms resize; a top-down keypoint crop keeps the "
        "config's `trainsize`: the scan cells give each input). The images are written in the format of the "
        "config's own TrainDataset class by bench/zoo_ppdet_data.py (COCO boxes and polygons, COCO person "
        "keypoints, Pascal VOC, MOT image lists with labels_with_ids, WIDER FACE text, CULane lanes, Pose3D json); "
        "a `_base_` fragment with no dataset of its own is laid over a config that names it in `_BASE_` (or its "
        "family's first scanned row), named in its config cell, and takes that config's dataset, TrainReader, "
        "class count, optimizer and schedule. Then K = "
        f"{doc['K']} steps of the tree's own `tools/train.py --amp --enable_ce True` (O1, ppdet's initial scale 1024, "
        "dynamic) at the config's optimizer, learning rate and schedule (warm-up included), random init, batch "
        f"{doc.get('batch', 2)}: natively (Paddle's GradScaler, float16 emulated by "
        "`ampsafe.paddle.amp_emulation.install()`) and under `ampsafe run --emulate-fp16` (defaults: "
        "`--on-floor heal`). Overflows, scale and heals of the ampsafe run come from its report.json; the native "
        "run's from Paddle's scaler (`_found_inf` per step); losses from ppdet's `TrainingStats`. The overlay "
        "over each config sets only `use_gpu: false`, `norm_type: bn` where the config says `sync_bn`, no "
        "pretrained weights and so `freeze_norm: false` where a class freezes its BatchNorms (frozen, they would "
        "keep their initial statistics, mean 0 and variance 1, and normalize nothing; rows scanned before the "
        "overlay did this say so), the synthetic data and `worker_num: 0`. A semi-supervised config "
        "(`ssod_method`, ppdet's own trainers) gets its SemiTrainReader shrunk likewise (batch "
        f"{doc.get('batch', 2)} labeled + {doc.get('batch', 2)} unlabeled), an UnsupTrainDataset of the same images "
        "without their boxes and no teacher or student weights; one without a TrainReader (ARSL) is scanned on its "
        "labeled view (sample, weak and labeled-batch transforms). Every run happens in a folder of its own, never "
        "in the tree, with empty stand-ins for the files a dataset checks when its config loads (the WIDER FACE "
        "validation `.mat` files).",
        "",
        f"Rows: {len(rows)}; trained: {sum(1 for r in rows if r.get('train'))}.",
    ]
    lines += _table(doc)
    lines += _facts(doc)
    lines += _accounting(doc)
    return "\n".join(lines) + "\n"
