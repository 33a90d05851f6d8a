"""One ``ampsafe run`` installation is one :class:`~ampsafe.run.session.RunSession`, and what the child hands the
parent are records (:mod:`ampsafe.run.records`) whose JSON keys are the ones the parent and the report read."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from ampsafe.run.options import RunOptions
from ampsafe.run.records import PermanentFix, RunSummary

# the keys of a scaler's summary row, as the parent process and the report read them
SCALER_KEYS = {
    "class", "framework", "script_kwargs", "scale", "disabled_reason", "model", "model_path", "heal_records",
    "hf_keep_in_fp32", "steps", "watch_backoffs", "backoff_scan", "island_levels", "engine_fixes", "reloads",
    "input_steps", "bad_inputs", "headroom", "underflow", "on_floor", "overflow_origins", "below_floor", "refusals",
    "static_scale", "total_steps", "skipped_steps", "overflow_steps", "floor_hits", "scale_history", "heals",
}  # fmt: skip
GUARD_KEYS = {
    "framework", "model", "total_steps", "skipped_steps", "skipped_at", "offenders", "scaler_steps",
    "unchecked_steps", "max_skips", "restored", "exit_origin", "no_scaler",
}  # fmt: skip


def test_a_summary_reads_back_from_its_json_as_it_was_written():
    summary = {
        "pid": 5,
        "options": RunOptions(watch=True).to_dict(),
        "changes": ["torch.GradScaler -> ampsafe.torch.GradScaler"],
        "scalers": [{"class": "ampsafe.torch.scaler.GradScaler", "framework": "torch", "steps": [[0, 8.0, True, False]],
                     "heal_records": [{"step": 0, "paths": ["head"]}], "island_levels": {"O2": ["where", "advice"]},
                     "engine_fixes": {"deepspeed_island": ["line", "advice"]},
                     "backoff_scan": {"step": 2, "paths": ["a"], "modules": ["a"], "error": None}}],
        "guards": [{"framework": "paddle", "exit_origin": {"step": 0, "phase": "forward", "kind": "input"}}],
        "targets": [{"where": "ppdet Gt2YoloTarget", "calls": 2, "bad_boxes": 1}],
        "ended": {"exit": 1, "where": "train.py:9"},
    }  # fmt: skip
    record = RunSummary.from_dict(json.loads(json.dumps(summary)))
    assert record.watch and record.scalers[0].skipped_at == [0] and record.scalers[0].heal_records[0].paths == ("head",)
    assert record.guards[0].exit_origin.kind == "input" and record.ended.exit == 1
    assert tuple(record.scalers[0].engine_fixes["deepspeed_island"]) == ("line", "advice")
    again = json.loads(json.dumps(record.to_dict()))
    assert set(again["scalers"][0]) == SCALER_KEYS and set(again["guards"][0]) == GUARD_KEYS
    assert RunSummary.from_dict(again) == record


def test_a_level_island_line_keeps_its_own_key_in_the_fix_json():
    fix = PermanentFix(patch="p", level_islands={"paddle_o2": "advice"}, level_lines={"paddle_o2": "line"})
    data = fix.to_dict()
    assert data["paddle_o2"] == "line" and data["level_islands"] == {"paddle_o2": "advice"}
    assert PermanentFix.from_dict(data) == fix


SESSION = """
import sys, torch
from ampsafe.run.options import RunOptions
from ampsafe.run.session import RunSession, current

hook = sys.excepthook
with RunSession(RunOptions(report=None, quiet=True, emulate_fp16=True)) as session:
    assert current() is session and sys.excepthook is not hook and torch.amp.GradScaler.__module__ == "ampsafe.auto"
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)
    for step in range(3):
        with torch.autocast("cuda"):
            loss = model(torch.randn(3, 4)).float().square().mean() * (1e36 if step == 1 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
assert not session.open and sys.excepthook is hook and torch.amp.GradScaler.__module__ != "ampsafe.auto"
row = session.summary().to_dict()["scalers"][0]
print(sorted(row))
print([tuple(r) for r in row["steps"]], row["overflow_steps"], row["script_kwargs"])
"""


def test_a_session_installs_on_enter_uninstalls_on_exit_and_records_each_step_once():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SESSION)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys, steps = proc.stdout.strip().splitlines()[-2:]
    assert set(eval(keys)) == SCALER_KEYS
    assert steps == "[(0, 1024.0, False, False), (1, 1024.0, True, False), (2, 512.0, False, False)] 1 " + str(
        {"init_scale": "1024.0"}
    )
