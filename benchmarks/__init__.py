"""Benchmarks driven by ``trajlake bench ...``: each prints a figure, its same-run baseline and the ratio.

One module per subject (``ingest``, ``lakehouse``, ``replay``, ``quality``, ``incremental``, ``fleet``,
``redaction``, ``judgement``); ``harness`` holds what they share. ``BENCHMARKS`` names the pipeline benchmarks that
return a plain dict of figures.
"""

from collections.abc import Callable
from typing import Any

from benchmarks.ingest import bench_decode, bench_freshness, bench_ingest, bench_memory, bench_scaleout
from benchmarks.lakehouse import bench_assemble, bench_query
from benchmarks.replay import bench_replay

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "ingest": bench_ingest,
    "decode": bench_decode,
    "query": bench_query,
    "memory": bench_memory,
    "assemble": bench_assemble,
    "scaleout": bench_scaleout,
    "replay": bench_replay,
    "freshness": bench_freshness,
}
