"""Benchmarks driven by ``trajlake bench ...``: each prints a figure, its same-run baseline and the ratio."""
