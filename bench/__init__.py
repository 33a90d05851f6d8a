"""Benchmarks. ``python -m bench`` / ``ampsafe bench``; each ``bench_*.py`` is one topic, results in ``bench/results``."""
