"""The cold tier on S3 read in place: a one-session lookup and a one-day aggregate at two cold-tier sizes.

The bench starts its own S3-compatible server (moto's, as the tests do), loads synthetic fleet
events into the cold ``raw_events`` table on it, one day of events per day partition, and runs
the queries the way ``trajlake sql`` does (:func:`warehouse.sql.run_query`: views opened, the
connection locked, one query) in a fresh child process per size, which reports its wall times
and peak RSS. The cold tier then grows and the same child runs again: RSS should not move.
Baseline: what every ``open_views`` did before, reading the whole cold table into Arrow
(pyiceberg's scan), measured at the smaller size only.

Each child starts with an empty footer cache (:class:`warehouse.object_store.FooterCache`): its
first lookup fetches every file's footer (``lookup_first_s``); the later ones, each of a session not
looked up before, are what a new ``trajlake sql`` process sees once the machine has read the tier.
The child also reports the ranged GETs and bytes each query asked of the store.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.harness import BASE_US, Figure, bench_home, cli_env, encoded_events, print_figures
from common.settings import load_settings
from pipelines.decode import BatchDecoder, with_coordinates
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.tables import RAW_EVENTS

_DAY_US = 86_400_000_000
_BUCKET = "trajlake-bench-cold"
_ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def load_cold_events(lake: Lakehouse, events: int, start: int = 0, per_day: int = 250_000) -> list[list[str]]:
    """Append ``events`` synthetic events to the cold ``raw_events`` table, ``per_day`` to a day partition.

    Days continue after the ``start`` events already loaded; each day's rows are sorted by
    session as tiering writes them. Returns five session ids per loaded day (lookup targets).
    """
    cold = lake.cold_table(RAW_EVENTS.name)
    schema = RAW_EVENTS.arrow_schema()
    now = datetime.now(UTC)
    sessions: list[list[str]] = []
    written = 0
    with BatchDecoder(schema, isolate=False) as decoder:  # our own well-formed bytes
        while written < events:
            n = min(per_day, events - written)
            day = (start + written) // per_day
            values = [v for _, _, v in encoded_events(n, seed=start + written + 1)]
            decoded = decoder.decode(values)
            rows = with_coordinates(
                decoded.events, schema, "bench", pa.array([0] * n, pa.int32()), pa.array(range(n)), now
            )
            # Squeeze the traffic's event times into its day (order kept), so a day is `per_day` events.
            ts = pc.cast(rows.column("ts"), pa.int64())
            low, high = pc.min(ts).as_py(), pc.max(ts).as_py()
            span = max(high - low, 1)
            scale = min(1.0, (_DAY_US - 1) / span)
            day_ts = pc.add(pc.cast(pc.multiply(pc.subtract(ts, low), scale), pa.int64()), BASE_US + day * _DAY_US)
            rows = rows.set_column(rows.schema.get_field_index("ts"), "ts", pc.cast(day_ts, schema.field("ts").type))
            rows = rows.sort_by([("session_id", "ascending"), ("seq", "ascending")])
            cold.append(rows.cast(cold.schema().as_arrow()))
            ids = rows.column("session_id")
            sessions.append([ids[n * k // 6].as_py() for k in range(1, 6)])
            written += n
            del rows, decoded, values
    return sessions


def query_child(sessions: list[str], day: int) -> None:
    """In a fresh process: lookups of ``sessions`` and the day aggregate through ``run_query``; prints times, RSS.

    The footer cache starts empty (the parent clears it), so the first lookup and the first
    aggregate fetch every footer they need (``*_first_s``); the others are what a new
    ``trajlake sql`` process sees once the cache holds the tier's footers — each lookup of a
    session not looked up before, so no data bytes are cached for it.
    """
    import time

    from warehouse.object_store import fetched
    from warehouse.query import run_query
    from warehouse.sql import open_views

    settings = load_settings()
    start = datetime.fromtimestamp((BASE_US + day * _DAY_US) / 1e6, UTC)

    def lookup(session_id: str) -> str:
        return f"SELECT * FROM cold_events WHERE session_id = '{session_id}' ORDER BY seq"

    aggregate = (
        "SELECT event_type, count(*), count(DISTINCT session_id) FROM cold_events "
        f"WHERE ts >= TIMESTAMPTZ '{start.isoformat()}' "
        f"AND ts < TIMESTAMPTZ '{(start + timedelta(days=1)).isoformat()}' "
        "GROUP BY event_type"
    )
    out: dict[str, Any] = {}
    runs = {"lookup": [lookup(s) for s in sessions[:4]], "aggregate": [aggregate] * 4}
    last = {"lookup": lookup(sessions[4]), "aggregate": aggregate}
    for name, queries in runs.items():
        seconds = []
        for query in queries:  # each run opens the views afresh, as `trajlake sql` does
            began = time.perf_counter()
            _, rows = run_query(settings, query)
            seconds.append(time.perf_counter() - began)
        out[f"{name}_first_s"] = seconds[0]
        out[f"{name}_s"] = min(seconds[1:])
        out[f"{name}_rows"] = sum(r[1] for r in rows) if name == "aggregate" else len(rows)
        # Split: opening the views (Iceberg metadata) vs the query on the open connection.
        began = time.perf_counter()
        con = open_views(settings, locked=True)
        out[f"{name}_views_s"] = time.perf_counter() - began
        requests, received = fetched()
        began = time.perf_counter()
        con.execute(last[name]).fetchall()
        out[f"{name}_query_s"] = time.perf_counter() - began
        # What that query asked of the store (ranged GETs of data files: footers come from the cache).
        out[f"{name}_gets"] = fetched()[0] - requests
        out[f"{name}_fetched_bytes"] = fetched()[1] - received
        con.close()
    out["peak_rss_bytes"] = _peak_rss()
    print(json.dumps(out))


def _peak_rss() -> int:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss`` it is not inherited across ``exec``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def full_load_child() -> None:
    """In a fresh process: the old path, the whole cold table read into Arrow; prints seconds and peak RSS."""
    import time

    from warehouse.cold import ensure_cold_table

    settings = load_settings()
    began = time.perf_counter()
    rows = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name).scan().to_arrow()
    seconds = time.perf_counter() - began
    print(json.dumps({"seconds": seconds, "rows": rows.num_rows, "peak_rss_bytes": _peak_rss()}))


def _child(code: str, env: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "PYTHONPATH": str(_ROOT)},
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=_ROOT,
    )
    if result.returncode != 0:
        raise RuntimeError(f"bench child failed: {result.stderr[-2000:]}")
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def bench_cold(
    events: int = 1_000_000, larger: int = 3_000_000, per_day: int = 250_000, baseline: bool = True
) -> dict[str, Any]:
    """Lookup and day aggregate over a cold tier of ``events`` and then ``larger`` events on S3.

    Args:
        events: Events in the cold tier at the first measurement.
        larger: Events at the second (the tier grows by appending days).
        per_day: Events per day partition.
        baseline: Also time the old whole-table read at ``events``.

    Returns:
        The figures and the raw measurements.
    """
    from moto.server import ThreadedMotoServer  # dev extra, like the S3 tests

    port = _free_port()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    aws = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    saved = {k: os.environ.get(k) for k in (*aws, "TRAJLAKE_COLD_WAREHOUSE")}
    try:
        os.environ.update(aws)
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=_BUCKET)
        os.environ["TRAJLAKE_COLD_WAREHOUSE"] = f"s3://{_BUCKET}/cold"
        with bench_home(kafka=False) as home_settings:
            settings = load_settings(home=home_settings.home_dir, topic=home_settings.topic)
            env = {**cli_env(settings), **aws, "TRAJLAKE_COLD_WAREHOUSE": os.environ["TRAJLAKE_COLD_WAREHOUSE"]}
            measured: dict[int, dict[str, Any]] = {}
            loaded = 0
            first_day: list[str] = []
            lake = Lakehouse.open(settings)
            full: dict[str, Any] = {}
            for size in (events, larger):
                sessions = load_cold_events(lake, size - loaded, start=loaded, per_day=per_day)
                first_day = first_day or sessions[0]
                loaded = size
                # The same sessions and the same day at both sizes: only the tier around them grows.
                shutil.rmtree(settings.footer_cache_path, ignore_errors=True)  # each child starts cold
                code = f"from benchmarks.cold import query_child; query_child({first_day!r}, 0)"
                measured[size] = _child(code, env)
                if baseline and size == events:
                    full = _child("from benchmarks.cold import full_load_child; full_load_child()", env)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    small, big = measured[events], measured[larger]
    figures = [
        Figure(
            f"one-session lookup, {larger:,} vs {events:,} cold events",
            big["lookup_query_s"],
            small["lookup_query_s"],
            "s",
            higher_is_better=False,
        ),
        Figure(
            f"one-day aggregate, {larger:,} vs {events:,} cold events",
            big["aggregate_query_s"],
            small["aggregate_query_s"],
            "s",
            higher_is_better=False,
        ),
        Figure(
            f"lookup as `trajlake sql` (views opened + locked), {larger:,} vs {events:,}",
            big["lookup_s"],
            small["lookup_s"],
            "s",
            higher_is_better=False,
        ),
        Figure(
            f"day aggregate as `trajlake sql`, {larger:,} vs {events:,}",
            big["aggregate_s"],
            small["aggregate_s"],
            "s",
            higher_is_better=False,
        ),
        Figure(
            f"first lookup of the process, footer cache empty, {larger:,} vs {events:,}",
            big["lookup_first_s"],
            small["lookup_first_s"],
            "s",
            higher_is_better=False,
        ),
        Figure(
            f"peak RSS, {larger:,} vs {events:,} cold events",
            big["peak_rss_bytes"] / 1e6,
            small["peak_rss_bytes"] / 1e6,
            "MB",
            higher_is_better=False,
        ),
    ]
    if full:
        figures.append(
            Figure(
                f"lookup as `trajlake sql` vs the old whole-table load, {events:,} events",
                small["lookup_s"],
                full["seconds"],
                "s",
                higher_is_better=False,
            )
        )
        figures.append(
            Figure(
                f"peak RSS vs the old whole-table load, {events:,} events",
                small["peak_rss_bytes"] / 1e6,
                full["peak_rss_bytes"] / 1e6,
                "MB",
                higher_is_better=False,
            )
        )
    result: dict[str, Any] = {
        "figures": [f.as_dict() for f in figures],
        "sizes": {str(k): v for k, v in measured.items()},
        "full_load": full,
        "rss_ratio_larger_over_smaller": big["peak_rss_bytes"] / small["peak_rss_bytes"],
    }
    print_figures("cold", figures, {k: v for k, v in result.items() if k != "figures"})
    return result
