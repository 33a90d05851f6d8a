"""An HF model that overflows float16 under ``ampsafe run``: the report's island and ``_keep_in_fp32_modules`` lines.

HF's Trainer calls the model with keywords (``model(**batch)``), so the backoff scan scans the batch dict. The
overflow is real: one layer's weight scaled so its float32 output reaches twice 65504 (T5's ``wo``, GPT-2's
``mlp.c_proj``), and every step overflows (skipped, the scale halves, no floor in 5 steps). Each line the report
gives is applied here to the user's model as the user would (the island line pasted, the keep list set on the
class before ``from_pretrained(..., dtype=torch.float16)``) and shown to remove the overflow. GPT-2's ``Conv1D``
does not cast a float16 input to a float32 weight, so no keep list works there: the report says what the trial
measured instead of giving a line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_models import batch, build, scale_past_float16  # noqa: E402

import ampsafe  # noqa: E402
from ampsafe.core.capture import example_inputs as scan_inputs  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "train_hf_tiny.py"
OVERFLOW = {"t5": "decoder.block.1.layer.2.DenseReluDense.wo", "gpt2": "transformer.h.1.mlp.c_proj"}
ISLAND = re.compile(r'`(ampsafe\.patch\(model, policy="island", paths=\[[^\]]*\]\))`')
KEEP = re.compile(r"`model\._keep_in_fp32_modules = (\[[^\]]*\])` \(tried on the model")


def _fix_section(name: str, tmp_path: Path, *, heal: bool = False) -> str:
    """The report's "Make the fix permanent" of a 5-step run; ``heal``: the floor 2 halvings from the scale the
    Trainer starts at, so that the run heals at step 2 instead of backing off for 5 steps."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--report", str(tmp_path / "report")]
    command += ["--min-scale", "16384"] if heal else []
    command += ["--", sys.executable, str(SCRIPT), "--model", name, "--fp16", "--steps", "5"]
    command += ["--overflow", OVERFLOW[name]]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ended = "1 floor hit" if heal else "5 steps, 5 skipped, 0 floor hits"
    assert ended in proc.stdout, proc.stdout[-3000:]
    markdown = (tmp_path / "report" / "report.md").read_text()
    fix = markdown.split("## Make the fix permanent")[1]
    assert "could not run" not in fix, fix
    return fix


def _overflowing(name: str):
    """The script's model (same seed, same scaled weight), in eval mode so that dropout draws nothing."""
    model = build(name)
    scale_past_float16(model, OVERFLOW[name], batch(name, seed=0))
    return model.eval()


def _autocast_loss(model, name: str):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        return model(**batch(name, seed=0)).loss


def _island_line_removes_the_overflow(fix: str, name: str) -> None:
    line = ISLAND.search(fix)
    assert line is not None, fix
    assert f"overflows at `{OVERFLOW[name]}` without it and nowhere with it" in fix
    model = _overflowing(name)
    assert not torch.isfinite(_autocast_loss(model, name))  # the overflow, as the run had it
    exec(line.group(1), {"ampsafe": ampsafe, "model": model})  # the line, pasted
    assert torch.isfinite(_autocast_loss(model, name))


def _float16_load(name: str, tmp_path: Path, keep):
    """The scaled model saved and loaded by HF as ``from_pretrained(..., dtype=torch.float16)`` with the class's
    ``_keep_in_fp32_modules`` set to ``keep``: (its loss, its overflowing layer's output) without autocast."""
    model = _overflowing(name)
    folder = tmp_path / f"saved-{name}"
    model.save_pretrained(folder)
    cls = type(model)
    with pytest.MonkeyPatch.context() as mp:
        # HF gathers the lists of the model's PreTrainedModel parts (T5's stacks): the class's list alone is ``keep``
        for part in {type(m) for m in model.modules() if hasattr(type(m), "_keep_in_fp32_modules")}:
            mp.setattr(part, "_keep_in_fp32_modules", None)
        mp.setattr(cls, "_keep_in_fp32_modules", keep)
        loaded = cls.from_pretrained(folder, dtype=torch.float16).eval()
    seen = {}
    layer = loaded.get_submodule(OVERFLOW[name])
    handle = layer.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
    try:
        with torch.no_grad():
            loss = loaded(**batch(name, seed=0)).loss
    finally:
        handle.remove()
    return loss, seen["out"]


@pytest.mark.slow
def test_t5_overflow_report_gives_an_island_line_and_a_keep_line_that_each_remove_it(tmp_path):
    fix = _fix_section("t5", tmp_path)
    _island_line_removes_the_overflow(fix, "t5")
    keep = KEEP.search(fix)
    assert keep is not None, fix
    names = json.loads(keep.group(1))
    params = [n for n, _ in _overflowing("t5").named_parameters()]
    assert all(any(entry in p for p in params) for entry in names), names  # the model's own names, no other's
    _, wo_out = _float16_load("t5", tmp_path, None)
    assert not torch.isfinite(wo_out).all()  # float16 throughout: wo overflows
    loss, wo_out = _float16_load("t5", tmp_path, names)
    assert torch.isfinite(wo_out).all() and wo_out.dtype == torch.float32 and torch.isfinite(loss)


@pytest.mark.slow
def test_gpt2_overflow_report_gives_the_island_line_and_the_measured_reason_for_no_keep_line(tmp_path):
    fix = _fix_section("gpt2", tmp_path)
    _island_line_removes_the_overflow(fix, "gpt2")
    assert KEEP.search(fix) is None, fix
    tried = re.search(r"`model\._keep_in_fp32_modules = (\[[^\]]*\])` was tried on the model: (.*?); no `_keep", fix)
    assert tried is not None, fix
    names = json.loads(tried.group(1))
    assert names == [OVERFLOW["gpt2"]]
    assert "raises RuntimeError: mat1 and mat2 must have the same dtype" in tried.group(2)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):  # what the report says
        _float16_load("gpt2", tmp_path, names)


@pytest.mark.slow
def test_a_heals_keep_line_is_printed_only_when_its_float16_trial_works(tmp_path):
    """At a heal the keep list is tried as HF applies it on an unpatched copy of the model: GPT-2's fails (its
    Conv1D does not cast), so the report gives the patch line and no keep line."""
    fix = _fix_section("gpt2", tmp_path, heal=True)
    assert "ampsafe.patch(model" in fix and OVERFLOW["gpt2"] in fix, fix
    assert "_keep_in_fp32_modules =" not in fix, fix
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):  # why: the list, applied
        _float16_load("gpt2", tmp_path, [OVERFLOW["gpt2"]])


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y=None, **extra):
        return self.lin(x) + (0 if y is None else y) + sum(extra.values())


class _Star(torch.nn.Module):
    def forward(self, *xs, y=None):
        return sum(xs)


def test_scan_inputs_names_positional_and_keyword_inputs_by_the_forward_signature():
    x, y, z = torch.ones(2, 4), torch.zeros(2, 4), torch.zeros(2, 4)
    model = _TwoInputs()
    assert scan_inputs(model, ((x,), {})) == (x,)
    assert scan_inputs(model, ((), {"x": x, "y": y})) == {"x": x, "y": y}
    named = scan_inputs(model, ((x,), {"y": y, "z": z}))
    assert named == {"x": x, "y": y, "z": z}
    assert ampsafe.scan(model, named).path("lin") is not None  # scan takes the dict as it is
    with pytest.raises(ValueError, match=r"\*args"):
        scan_inputs(_Star(), ((x,), {"y": y}))
