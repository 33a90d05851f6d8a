"""Reading scalars back from TensorBoard event files, with the ``tensorboard`` package's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] over every event file under ``logdir`` (in file order, then write order)."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    found: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(logdir).rglob("events.out.tfevents.*"))
    assert files, f"no event file under {logdir}"
    for path in files:
        reader = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
        reader.Reload()
        for tag in reader.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in reader.Scalars(tag))
    return found


def last(series: dict[str, list[tuple[int, float]]], prefix: str = "") -> dict[str, float]:
    """The last value of each ``prefix + amp/...`` tag, keyed by its ``amp/...`` name."""
    return {tag[len(prefix) :]: values[-1][1] for tag, values in series.items() if tag.startswith(prefix + "amp/")}
