"""Admission's cost on one chunk: this checkout's ``apply_ownership`` vs another ref's, same events, same process;
also this checkout's whole gate (``pipelines.intake.admission.admit``: signature, ownership, origins, token strings).

Usage: ``.venv/bin/python scripts/admission_ab.py [SESSIONS] [REF]`` (defaults: 2000 sessions, ``main``).
Prints the best of nine runs of each, twice, alternating. The other ref's module is read with
``git show`` (``pipelines/intake/ownership.py``, or ``pipelines/ownership.py`` before the intake package).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import types
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.ingest.rows import event_row
from pipelines.intake.admission import admit, set_door_key
from pipelines.intake.ownership import apply_ownership
from schemas.registry import decode_event, encode_event
from tests.helpers import sample_events
from warehouse.tables import RAW_EVENTS


def _other(ref: str) -> types.ModuleType:
    for path in ("pipelines/intake/ownership.py", "pipelines/ownership.py"):
        shown = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=False)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"no ownership module at {ref}")
    source = shown.stdout.replace("from pipelines.quarantine import", "from pipelines.intake.quarantine import")
    module = types.ModuleType(f"ownership_{ref}")
    exec(compile(source, f"{ref}:ownership.py", "exec"), module.__dict__)
    return module


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ref = sys.argv[2] if len(sys.argv) > 2 else "main"
    events = sample_events(sessions)
    now = datetime.now(UTC)
    rows = [event_row(decode_event(encode_event(e)), "t", 0, i, now) for i, e in enumerate(events)]
    con = duckdb.connect()
    con.register("src", pa.Table.from_pylist(rows, schema=RAW_EVENTS.arrow_schema()))
    trusted = ("fleet_evaluator", "harness_report", "harbor_verifier")
    with tempfile.TemporaryDirectory() as home:
        set_door_key(con, Path(home))
    candidates = [(ref, _other(ref).apply_ownership), ("this checkout", apply_ownership), ("the whole gate", admit)]
    for name, function in candidates * 2:
        best = float("inf")
        for _ in range(9):
            con.execute("CREATE OR REPLACE TEMP TABLE ev AS SELECT * FROM src")
            started = time.perf_counter()
            function(con, trusted)
            best = min(best, time.perf_counter() - started)
        print(f"{name}: {len(events)} events, best of 9 {best * 1000:.1f} ms")


if __name__ == "__main__":
    main()
