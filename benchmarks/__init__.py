"""Benchmarks driven by ``trajlake bench ...``: each prints a figure, its same-run baseline and the ratio.

One module per subject (``ingest``, ``lakehouse``, ``replay``, ``quality``, ``incremental``, ``fleet``,
``redaction``, ``judgement``, ``fuzz``, …); ``harness`` holds what they share and ``cli`` the commands
that run them. Importing this package imports none of them.
"""
