"""Framework-neutral core: the dataflow graph, path analysis, reports and the loss-scale state machine.

Nothing in ``ampsafe.core`` imports torch or paddle; adapters translate their framework into these types.
"""
