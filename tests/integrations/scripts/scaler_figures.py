"""The scaler's own figures, as the integration scripts print them for their tests to compare with the logger."""

from __future__ import annotations


def scaler_figures(scaler) -> dict:
    """Scale and counters read straight from an ampsafe scaler (not through ``ampsafe.integrations``)."""
    stats = scaler.stats
    return {
        "scale": scaler.get_scale(),
        "total_steps": stats.total_steps,
        "overflow_steps": stats.overflow_steps,
        "skipped_steps": stats.skipped_steps,
        "heals": len(stats.heals),
        "floor_hits": stats.floor_hits,
    }
