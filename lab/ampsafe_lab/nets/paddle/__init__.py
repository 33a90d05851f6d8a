"""Paddle networks of the lab: the ``dbnet`` workload's DBNet and its parts, PaddleOCR's PP-OCRv4 detector.

Nothing is imported here; the workloads import a network's module when they build it.
"""
