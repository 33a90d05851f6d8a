"""DBNet workload benchmark: reference agreement, FP32 step time, loss trajectory, hmean run, brink checkpoint.

quick: train (seed 0, 128x128, batch 8, Adam lr 1e-3) until hmean on 64 held-out images reaches 0.5 (checked
every 25 steps, at most 200 steps). full: 300 steps, hmean every 50.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import write_result

SUITES = {
    "quick": {"max_steps": 200, "eval_every": 25, "stop_at": 0.5},
    "full": {"max_steps": 300, "eval_every": 50, "stop_at": None},
}


def _reference_diffs() -> dict | None:
    import paddle

    from ampsafe_lab.workloads.dbnet import build_loss, build_model
    from ampsafe_lab.workloads.dbnet.config import load_config

    # the reference run is test data beside the checkout (not shipped in the package): shared/upstream/PaddleOCR
    shared = Path(os.environ.get("AMPSAFE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    ref = shared / "upstream" / "PaddleOCR" / "reference" / "det_mv3_db"
    if not ref.is_dir():
        return None
    cfg = load_config()
    model = build_model(cfg["Architecture"])
    weights = np.load(ref / "state_dict.npz")
    model.set_state_dict({k: paddle.to_tensor(weights[k]) for k in weights.files})
    image = paddle.to_tensor(np.load(ref / "input.npy"))
    model.eval()
    eval_maps = model(image)["maps"].numpy()
    model.set_state_dict({k: paddle.to_tensor(weights[k]) for k in weights.files})
    model.train()
    maps = model(image)
    labels = np.load(ref / "labels.npz")
    batch = [image] + [
        paddle.to_tensor(labels[k]) for k in ("threshold_map", "threshold_mask", "shrink_map", "shrink_mask")
    ]
    terms = build_loss(cfg["Loss"])(maps, batch)
    expected = json.loads((ref / "loss.json").read_text())
    train_ref = np.load(ref / "out_train_maps.npy")
    return {
        "state_dict_tensors": len(model.state_dict()),
        "train_maps_max_abs_diff": float(np.abs(maps["maps"].numpy() - train_ref).max()),
        "eval_maps_max_abs_diff": float(np.abs(eval_maps - np.load(ref / "out_eval_maps.npy")).max()),
        "loss_terms_max_abs_diff": max(abs(float(terms[k]) - v) for k, v in expected.items()),
    }


def _train(suite: dict) -> dict:
    from ampsafe_lab.workloads import build

    w = build("dbnet", seed=0, image_size=128, batch_size=8)
    optimizer = w.make_optimizer(1e-3)
    losses, step_seconds, data_seconds, curve = [], [], [], []
    reached, started = None, time.perf_counter()
    for step in range(suite["max_steps"]):
        t0 = time.perf_counter()
        batch = w.batch(step)
        t1 = time.perf_counter()
        loss = w.loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
        step_seconds.append(time.perf_counter() - t1)
        data_seconds.append(t1 - t0)
        if (step + 1) % suite["eval_every"] == 0:
            metrics = w.evaluate(n_images=64)
            curve.append({"steps": step + 1, "seconds": round(time.perf_counter() - started, 1), **metrics})
            if reached is None and metrics["hmean"] >= 0.5:
                reached = curve[-1]
                if suite["stop_at"] is not None:
                    break
    return {
        "seconds_per_fp32_step_128_b8": statistics.median(step_seconds[1:]),
        "seconds_per_batch_synthesis_b8": statistics.median(data_seconds),
        "first20_losses": [round(v, 4) for v in losses[:20]],
        "first5_mean": float(np.mean(losses[:5])),
        "steps16_20_mean": float(np.mean(losses[15:20])),
        "hmean_curve": curve,
        "reached_hmean_0.5": reached,
        "total_seconds": round(time.perf_counter() - started, 1),
    }


def _brink() -> dict:
    from ampsafe_lab.workloads.dbnet import brink

    cached = brink.cache_path(0).is_file()
    rec = brink.brink_record(0)
    return {
        "from_cache": cached,
        "crossed_step": rec["crossed_step"],
        "first_layer": rec["first_layer"],
        "watched_at_crossing": rec["watched_at_crossing"],
        "probe_after": rec["probe"],
        "max_by_step": [round(h["max"], 1) for h in rec["history"]],
        "train_seconds": rec["train_seconds"],
    }


def run(suite: str = "quick") -> dict:
    load_before = os.getloadavg()
    data = {"suite": suite, "reference": _reference_diffs(), "training": _train(SUITES[suite]), "brink": _brink()}
    data["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    ref, tr, br = data["reference"], data["training"], data["brink"]
    lines = ["## DBNet (det_mv3_db, PaddleOCR rebuilt)", ""]
    if ref:
        lines += [
            f"- Reference agreement ({ref['state_dict_tensors']} tensors): train maps max |diff| {ref['train_maps_max_abs_diff']:.3g}, "
            f"eval maps {ref['eval_maps_max_abs_diff']:.3g}, DBLoss terms {ref['loss_terms_max_abs_diff']:.3g}.",
        ]
    reached = tr["reached_hmean_0.5"]
    lines += [
        f"- FP32 step (forward + backward + Adam), 128x128, batch 8: {tr['seconds_per_fp32_step_128_b8']:.3f} s "
        f"(+ {tr['seconds_per_batch_synthesis_b8']:.3f} s to synthesize the batch); 1-min load average "
        f"{data['load_average_before_after'][0]} before, {data['load_average_before_after'][1]} after (shared cores).",
        f"- Loss, Adam lr 1e-3: mean of steps 1-5 {tr['first5_mean']:.3f}, steps 16-20 {tr['steps16_20_mean']:.3f}.",
        (
            f"- hmean >= 0.5 on 64 held-out images after {reached['steps']} steps ({reached['seconds']} s incl. evals): "
            f"hmean {reached['hmean']:.3f}, precision {reached['precision']:.3f}, recall {reached['recall']:.3f}."
            if reached
            else f"- hmean 0.5 NOT reached in {len(tr['first20_losses'])}+ steps."
        ),
        "",
        "| steps | seconds | hmean | precision | recall |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['steps']} | {c['seconds']} | {c['hmean']:.3f} | {c['precision']:.3f} | {c['recall']:.3f} |"
        for c in tr["hmean_curve"]
    ]
    watched = ", ".join(f"{k} {v:.4g}" for k, v in br["watched_at_crossing"].items())
    lines += [
        "",
        f"- Brink (lr 1e-2): first crossed 65504 at step {br['crossed_step']} in `{br['first_layer']}`; at that step: {watched}.",
        f"- Max activation by step: {br['max_by_step']}.",
    ]
    write_result("dbnet", data, "\n".join(lines))
    return data


if __name__ == "__main__":
    import sys

    run(sys.argv[1] if len(sys.argv) > 1 else "quick")
