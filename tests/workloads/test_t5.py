"""The ``t5`` workload: HF's own ``T5ForConditionalGeneration``, whose ``DenseReluDense.wo`` leaves float16's range.

HF transformers issue #5651: T5's ``wo`` output reached 66246 > 65504 under float16 and the loss went NaN; HF
keeps ``wo`` in float32 (``_keep_in_fp32_modules``). Here the recipe of ``ampsafe_lab.workloads.t5_brink`` drives the
same module past 65504 through FP32 training (cached brink, a few seconds to build); the float16 runs use CPU
autocast with CUDA's op lists, as ``ampsafe run --emulate-fp16`` does.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ampsafe
from ampsafe_lab.workloads import build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ampsafe_lab.workloads import t5_brink  # noqa: E402
from ampsafe_lab.workloads.t5 import emulated_cuda_amp, keep_in_fp32_half  # noqa: E402

WO = t5_brink.WO
FP16_MAX = 65504.0
SCRIPT = Path(__file__).parent / "scripts" / "train_t5_cuda_amp.py"
STEPS = 8  # from the brink, every native step overflows: its scale falls 2^8, at least 2^3 more than asserted
COLLAPSE = 2.0**5
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _first_overflow(model, inputs) -> str | None:
    """The first leaf module (in forward order) whose output is non-finite, or None."""
    with t5_brink.leaf_amax(model) as amax:
        model(*inputs)
    return next((name for name, value in amax.amax.items() if not math.isfinite(value)), None)


def test_t5_is_hf_t5_for_conditional_generation_built_from_a_config():
    w = build("t5", seed=0)
    assert w.framework == "torch" and type(w.model) is transformers.T5ForConditionalGeneration
    assert type(w.model).__module__ == "transformers.models.t5.modeling_t5"  # HF's class, not a copy
    cfg = w.model.config
    assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.dropout_rate, cfg.feed_forward_proj) == (128, 2048, 2, 0, "relu")
    assert w.model.training
    assert isinstance(w.model.get_submodule(WO), torch.nn.Linear)
    a, b = w.batch(3), w.batch(3)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["input_ids"], w.batch(4)["input_ids"])
    assert torch.equal(a["labels"], a["input_ids"]) and int(a["input_ids"].min()) >= 2  # copy task, no pad/eos
    loss = w.loss(a)
    assert loss.ndim == 0 and torch.isfinite(loss)
    out = w.model(*w.example_inputs)
    assert out.logits.shape == (8, 32, 128)


def test_t5_rejects_bad_sizes():
    with pytest.raises(ampsafe.ConfigError, match="seq_len"):
        build("t5", seq_len=1)


def test_import_ampsafe_and_its_workloads_does_not_import_transformers():
    code = "import sys, ampsafe, ampsafe_lab.workloads; print('transformers' in sys.modules, ampsafe_lab.workloads.names())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False") and "'t5'" in out.stdout, out.stdout


def test_run_report_words_a_heal_in_hf_terms_only_for_hf_models():
    from ampsafe.run.report import permanent_fix, to_markdown

    row = {"framework": "torch", "class": "ampsafe.torch.scaler.GradScaler", "heals": 1, "scale": 1024.0}
    row["heal_records"] = [{"step": 3, "paths": [WO, "decoder.final_layer_norm"]}]
    plain = permanent_fix({"scalers": [{**row, "hf_keep_in_fp32": None}]})
    assert plain.hf_keep_in_fp32 is None and WO in plain.patch
    report = {"scalers": [{**row, "hf_keep_in_fp32": [WO]}]}
    fix = permanent_fix(report)
    assert fix.hf_keep_in_fp32 == f'model._keep_in_fp32_modules = ["{WO}"]'
    text = to_markdown(report, fix, plot=None)
    assert fix.hf_keep_in_fp32 in text and fix.patch in text and "from_pretrained" in text


@pytest.mark.trajectory
def test_brink_recipe_drives_wo_past_65504_in_fp32(brink_seed):
    rec = t5_brink.brink_record(brink_seed)
    assert rec["first_layer"] == WO, rec["over_fp16_at_crossing"]
    assert rec["crossed_step"] > t5_brink.RECIPE["warm_steps"]  # the warm state is still in range
    assert rec["probe"][WO] > t5_brink.PROBE_FACTOR * FP16_MAX
    # T5's unscaled attention logits stay a bit or more inside float16's range: wo is the one that leaves it
    assert rec["qk_logits_probe"] < FP16_MAX / 2, rec["qk_logits_probe"]
    losses = [h["loss"] for h in rec["history"]]
    assert sum(losses[-3:]) / 3 < 0.7 * losses[0], losses  # the model trains while wo grows


@pytest.mark.trajectory
def test_native_float16_overflows_first_at_wo(brink_seed):
    w, _, _ = t5_brink.brink_start(brink_seed)
    with torch.no_grad(), emulated_cuda_amp(), torch.autocast("cuda", dtype=torch.float16):
        assert _first_overflow(w.model, w.example_inputs) == WO
    with torch.no_grad():
        assert _first_overflow(w.model, w.example_inputs) is None  # float32 holds it: an overflow, not a bug
        with t5_brink.leaf_amax(w.model) as amax:
            w.model(*w.example_inputs)
    assert max(amax.amax, key=amax.amax.get) in (WO, WO.replace("DenseReluDense.wo", "dropout"))  # wo's output


def _forward_overflows(seed: int) -> set[str]:
    w, _, _ = t5_brink.brink_start(seed)
    report = ampsafe.scan(w.model, w.example_inputs, target="cuda")
    return {p.start for p in report.paths if p.overflows_in == "forward"}


@pytest.mark.trajectory
def test_scan_names_wo_as_a_forward_overflow_and_not_the_attention(brink_seed):
    forward = _forward_overflows(brink_seed)
    assert WO in forward, sorted(forward)
    # q, k, v and the attention itself (its masks, position bias and logits, 2 bits inside the range) do not overflow
    attention = {p for p in forward if p.rpartition(".")[2] in ("q", "k", "v", "SelfAttention", "EncDecAttention")}
    assert not attention, sorted(attention)


@pytest.mark.trajectory
def test_scan_flags_no_forward_overflow_but_wo(brink_seed):
    forward = _forward_overflows(brink_seed)
    # the path from wi ends at wo's matmul, so it carries wo's output: the same value, named from upstream
    assert forward <= {WO, WO.replace(".wo", ".wi")}, sorted(forward)


@pytest.mark.trajectory
@pytest.mark.slow
def test_island_and_heal_keep_the_scale_where_torchs_scaler_collapses(brink_seed):
    from ampsafe_lab.demo import run_t5

    runs = {
        mode: run_t5(mode, steps=STEPS, lr=None, level="O1", seed=brink_seed, warm=False).summary()
        for mode in ("amp", "native", "island", "heal")
    }
    native, island, heal, amp = runs["native"], runs["island"], runs["heal"], runs["amp"]
    # the scale each step ran with: 1024, halved after each overflowing step
    assert native["overflowing_steps"] == STEPS and native["final_scale"] <= 1024.0 / 2 ** (STEPS - 1), native
    assert "parameters non-finite" in amp["notes"], amp  # plain AMP applies the NaN gradients
    assert island["overflowing_steps"] == 0, island
    assert island["final_scale"] >= COLLAPSE * native["final_scale"], (island, native)
    assert heal["final_scale"] >= COLLAPSE * native["final_scale"] and "healed at step" in heal["notes"], heal
    assert heal["overflowing_steps"] <= 3, heal  # patience 2, then none


@pytest.mark.trajectory
@pytest.mark.slow
def test_run_report_gives_keep_in_fp32_modules_naming_wo_and_applying_it_fixes_float16(brink_seed, tmp_path):
    report = tmp_path / "report"
    cmd = [sys.executable, "-m", "ampsafe.cli", "run", "--emulate-fp16", "--min-scale", "64", "--report", str(report)]
    out = subprocess.run(
        [*cmd, "--", sys.executable, str(SCRIPT), str(brink_seed)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    fix = __import__("json").loads((report / "report.json").read_text())["fix"]
    line = fix["hf_keep_in_fp32"]
    assert line is not None and line.startswith("model._keep_in_fp32_modules = ") and WO in line, fix
    assert WO in fix["patch"]  # beside ampsafe's own island line
    assert line in (report / "report.md").read_text()

    # the model in pure float16 as HF casts it, without HF's own list: wo overflows
    w, _, _ = t5_brink.brink_start(brink_seed)
    w.model._keep_in_fp32_modules = set()
    assert keep_in_fp32_half(w.model) == []
    with torch.no_grad():
        assert _first_overflow(w.model, w.example_inputs) == WO
    # the report's line applied to a fresh brink model, cast the same way: no overflow, a finite loss
    w, _, _ = t5_brink.brink_start(brink_seed)
    model = w.model
    exec(textwrap.dedent(line), {"model": model})
    assert f"{WO}.weight" in keep_in_fp32_half(model)
    assert model.get_submodule(WO).weight.dtype == torch.float32 and model.shared.weight.dtype == torch.float16
    with torch.no_grad():
        assert _first_overflow(model, w.example_inputs) is None
        assert torch.isfinite(model(**w.batch(0)).loss)
