"""Shared benchmark plumbing: machine record, median timing, and writing JSON + markdown results."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def deadline(until: str | None) -> float | None:
    """A sweep's ``--until HH:MM`` (UTC) as epoch seconds: today's, or tomorrow's when today's lies over 12 hours
    back; None without one."""
    if not until:
        return None
    now = _dt.datetime.now(_dt.timezone.utc)
    hh, mm = (int(v) for v in until.split(":"))
    stop = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    if stop < now - _dt.timedelta(hours=12):
        stop += _dt.timedelta(days=1)
    return stop.timestamp()


def machine() -> dict:
    """CPU model, cores, GPU and framework versions: recorded with every result."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "gpu": None}
    # Float32 results differ between instruction sets (oneDNN/MKL pick other kernels): record which ones ran.
    info["isa"] = _vector_isa()
    info["isa_env"] = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR") if k in os.environ}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        import paddle

        info["paddle"] = paddle.__version__
    except ImportError:
        pass
    info["date"] = _dt.date.today().isoformat()
    return info


def _vector_isa() -> str:
    """The widest vector extensions of this CPU: "avx512+amx", "avx512", "avx2", or "" when unknown."""
    try:
        flags = next(
            (
                line.split(":", 1)[1].split()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("flags")
            ),
            [],
        )
    except OSError:
        return ""
    if "avx512f" in flags:
        return "avx512+amx" if any(f.startswith("amx") for f in flags) else "avx512"
    return "avx2" if "avx2" in flags else ("avx" if "avx" in flags else "")


def machine_tag(info: dict | None = None) -> str:
    info = info or machine()
    return "gpu" if info.get("gpu") else f"cpu{info['cores']}"


def median_time(fn, *, repeats: int = 5, warmup: int = 1, sync=None) -> tuple[float, list[float]]:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs (``sync`` e.g. cuda sync)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def write_result(topic: str, data: dict, markdown: str, *, results: Path = RESULTS) -> tuple[Path, Path]:
    """Write ``results/<topic>.json`` (data + machine) and ``results/<topic>.md`` (markdown + machine line)."""
    results.mkdir(parents=True, exist_ok=True)
    info = data.setdefault("machine", machine())
    jpath, mpath = results / f"{topic}.json", results / f"{topic}.md"
    jpath.write_text(json.dumps(data, indent=2, default=str) + "\n")
    header = (
        f"# {topic}\n\nMachine: {info.get('cpu')}, {info.get('cores')} cores, GPU: {info.get('gpu') or 'none'}, "
        f"torch {info.get('torch', '-')}, paddle {info.get('paddle', '-')}, {info.get('date')}.\n\n"
    )
    mpath.write_text(header + markdown.rstrip() + "\n")
    return jpath, mpath


def track(items, description: str):
    """A rich progress bar over ``items`` (the long accuracy and timing loops); plain iteration without rich."""
    items = list(items)
    try:
        from rich.progress import track as rich_track
    except ImportError:  # rich is in the bench/dev extras; the numbers do not need it
        return iter(items)
    return rich_track(items, description=description, total=len(items))
