"""Read Iceberg tables with DuckDB's own Iceberg extension: the "other engine" check.

Runs in a separate virtual environment holding DuckDB 1.5.5 and the PyPI wheels
``duckdb-extension-avro`` and ``duckdb-extension-iceberg`` (which pin that DuckDB);
the extensions load from the wheels' files, no network. trajlake itself uses
DuckDB 2.x, which these extension builds do not load into.

Input (stdin): JSON ``{"key": {"metadata": "<metadata.json path>", "select": "<SQL select list>"}}``.
Output (stdout): JSON ``{"key": [values of the select list]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg


def extension_file(module: object, name: str) -> Path:
    """The extension binary shipped in a ``duckdb-extension-*`` wheel for this DuckDB version."""
    root = Path(module.__file__).parent / "extensions"  # type: ignore[attr-defined]
    found = sorted(root.glob(f"*/{name}.duckdb_extension"))
    if not found:
        raise SystemExit(f"no {name}.duckdb_extension under {root}")
    return found[-1]


def main() -> None:
    """Answer the request on stdin."""
    request = json.load(sys.stdin)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # avro first: the iceberg extension reads manifests through it.
    con.execute(f"LOAD '{extension_file(duckdb_extension_avro, 'avro')}'")
    con.execute(f"LOAD '{extension_file(duckdb_extension_iceberg, 'iceberg')}'")
    answer = {}
    for key, spec in request.items():
        metadata = spec["metadata"].removeprefix("file://")
        row = con.execute(f"SELECT {spec['select']} FROM iceberg_scan('{metadata}')").fetchone()
        answer[key] = list(row)
    json.dump(answer, sys.stdout, default=str)


if __name__ == "__main__":
    main()
