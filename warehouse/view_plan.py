"""The view plan: what the table views read, kept in ``TRAJLAKE_HOME`` so a query can skip the catalog stack.

Opening the views through the catalog (:func:`warehouse.sql.open_views`) imports pyiceberg (and
with it SQLAlchemy, pandas, …), loads every table and plans its files: most of a short query's
time. Yet what it produces is a handful of DuckDB statements — views over lists of Parquet files,
empty tables with each view's columns — that depend only on

- each table's current metadata file, which the catalog points to (Iceberg metadata files are
  never rewritten: a commit writes a new one and moves the pointer),
- the settings, and the code that turns metadata into views (this package, ``schemas``, DuckDB
  and pyiceberg as installed).

So when ``trajlake sql`` opens the views through the catalog, it records them here
(:class:`ViewPlan`, written to ``view-plan.json`` atomically) with the metadata file of every
table it read and a key of the rest. The next query (:func:`open_planned_views`) reads the
catalog's pointers straight from its SQLite file (one ``SELECT``, no pyiceberg), and rebuilds
the views from the plan only if every table still points where the plan was made and the key is
the same; anything else — another commit, another catalog or setting, a newer trajlake, a
missing, corrupt or foreign file, a catalog that is not the default SQLite one — opens them
through the catalog, which writes a new plan. A plan is only written when replaying it gives
views of exactly the columns and types of the ones it was recorded from (its statements are the
ones that ran; the empty tables it makes again must come back with the same columns, see
:func:`_round_trips`), and never for views that read data through pyiceberg or an object store
(delete files, ``s3://`` tiers).

``TRAJLAKE_SQL_VIEW_CACHE=false`` turns the plan off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import duckdb

from common.settings import CATALOG_FILE, Settings
from warehouse.sql_lock import connect, finish_views

log = logging.getLogger(__name__)

#: The plan file's format; a file of any other format is ignored.
FORMAT = "trajlake-view-plan/1"
#: The plan's file name in ``TRAJLAKE_HOME``.
PLAN_FILE = "view-plan.json"
#: Empty tables standing in for a table without rows are named so (see ``warehouse.sql._source``).
_EMPTY_PREFIX = "__empty_"
_VIEW_PREFIX = 'CREATE OR REPLACE VIEW "'


@dataclass
class ViewPlan:
    """The table views of one opening, as they are built: the statements, and what they depend on.

    Attributes:
        tables: ``(namespace, table)`` → the metadata file the views read it at.
        empty: Names of the empty tables the views may read (their columns are taken when saved).
        statements: ``CREATE OR REPLACE VIEW`` statements, in order.
        reads: The data files the views read directly (the lock's ``allowed_paths``).
        cacheable: False once a view reads data some other way (an Arrow table read by pyiceberg,
            an object-store filesystem), which a plan cannot replay.
    """

    tables: dict[tuple[str, str], str] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    reads: set[str] = field(default_factory=set)
    cacheable: bool = True

    def read_table(self, identifier: tuple[str, ...], metadata_location: str) -> None:
        """Record that the views read table ``identifier`` at ``metadata_location``."""
        self.tables[(".".join(identifier[:-1]), identifier[-1])] = metadata_location

    def view(self, con: duckdb.DuckDBPyConnection, statement: str) -> None:
        """Run a ``CREATE OR REPLACE VIEW`` statement on ``con`` and record it."""
        con.execute(statement)
        self.statements.append(statement)


def view(con: duckdb.DuckDBPyConnection, statement: str, plan: ViewPlan | None) -> None:
    """Run a view statement on ``con``, recording it in ``plan`` when there is one."""
    if plan is None:
        con.execute(statement)
    else:
        plan.view(con, statement)


def plan_path(settings: Settings) -> Path:
    """Where the plan of ``settings``' lakehouse is kept."""
    return settings.home_path / PLAN_FILE


def _usable(settings: Settings) -> bool:
    """Whether a plan may be used: turned on, and the catalog is the SQLite file in ``TRAJLAKE_HOME``."""
    return settings.sql_view_cache and not settings.catalog_is_external


def _stamp(root: Path) -> list[Any]:
    """Name, size and modification time of every file under ``root`` (no caches)."""
    found: list[Any] = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(Path(entry.path))
                elif entry.name.endswith((".py", ".avsc", ".json")):
                    stat = entry.stat()
                    found.append([entry.path, stat.st_size, stat.st_mtime_ns])
    return sorted(found)


def _installed(module: str) -> list[Any]:
    """Where ``module`` is installed and when its entry file changed, without importing it."""
    spec = find_spec(module)
    origin = spec.origin if spec is not None else None
    if not origin:
        return [module, None]
    stat = os.stat(origin)
    return [origin, stat.st_size, stat.st_mtime_ns]


def plan_key(settings: Settings) -> str:
    """What a plan depends on besides the tables' metadata files: settings, code, libraries."""
    package = Path(__file__).resolve().parent
    parts = [
        FORMAT,
        str(settings.home_path),
        settings.model_dump_json(),
        duckdb.__version__,
        _installed("pyiceberg"),
        _stamp(package),
        _stamp(package.parent / "schemas"),
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def catalog_pointers(settings: Settings) -> dict[tuple[str, str], str]:
    """``(namespace, table)`` → current metadata file, read from the SQLite catalog without pyiceberg.

    The rows pyiceberg's SQL catalog keeps (``iceberg_tables``); one read-only query, so the
    pointers are those of one moment.

    Raises:
        sqlite3.Error: the catalog cannot be read (missing, locked past the timeout, another layout).
    """
    path = settings.home_path / CATALOG_FILE
    if not path.is_file():
        raise sqlite3.OperationalError(f"no catalog at {path}")
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=10)) as db:
        rows = db.execute(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables WHERE catalog_name = ?",
            (settings.catalog_name,),
        ).fetchall()
    return {(str(ns), str(name)): str(location) for ns, name, location in rows if location}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty_table_sql(name: str, columns: list[list[str]]) -> str:
    return f"CREATE TABLE {_quote(name)} (" + ", ".join(f"{_quote(c)} {t}" for c, t in columns) + ")"


def _round_trips(con: duckdb.DuckDBPyConnection, empty: dict[str, list[list[str]]]) -> bool:
    """Whether each empty table, made again from its recorded columns, has exactly the columns it had on ``con``.

    The empty tables are the only part of a plan that is not replayed verbatim: the views are the very
    statements that ran on ``con``, and the data files they read are immutable, so views replayed over
    empty tables of the same columns and types are the views ``con`` has. A type whose text does not
    parse back to itself would break that; each table is made once as a temporary table on ``con`` and
    described again (no data file is read, unlike describing every view).
    """
    for index, (name, columns) in enumerate(empty.items()):
        check = f"__plan_check_{index}"
        con.execute(_empty_table_sql(check, columns).replace("CREATE TABLE ", "CREATE TEMP TABLE ", 1))
        try:
            again = [[str(row[0]), str(row[1])] for row in con.execute(f"DESCRIBE {_quote(check)}").fetchall()]
        finally:
            con.execute(f"DROP TABLE {_quote(check)}")
        if again != columns:
            log.warning("the view plan's empty table %s does not round-trip; not cached", name)
            return False
    return True


def save_plan(settings: Settings, plan: ViewPlan, con: duckdb.DuckDBPyConnection) -> bool:
    """Write ``plan``, recorded while its views were made on ``con``, if a replay makes the same views.

    Nothing is written when the plan cannot be used (see the module) or its replay would differ
    (:func:`_round_trips`); a failure to write is logged and otherwise ignored (the next query opens
    the views the long way).

    Returns:
        Whether the plan was written.
    """
    if not plan.cacheable or not _usable(settings):
        return False
    try:
        empty = {
            name: [[str(row[0]), str(row[1])] for row in con.execute(f"DESCRIBE {_quote(name)}").fetchall()]
            for name in plan.empty
        }
        if not _round_trips(con, empty):
            return False
        body = {
            "key": plan_key(settings),
            "tables": sorted([ns, table, location] for (ns, table), location in plan.tables.items()),
            "empty": empty,
            "statements": plan.statements,
            "reads": sorted(plan.reads),
        }
        _write(plan_path(settings), body)
        return True
    except (OSError, duckdb.Error, ValueError) as exc:
        log.warning("could not save the view plan: %s", exc)
        return False


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write(path: Path, body: dict[str, Any]) -> None:
    """Replace ``path`` with the plan in one step: a reader sees the old file or the new, never a part."""
    text = json.dumps({"format": FORMAT, "digest": _digest(body), "body": body}, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{PLAN_FILE}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_plan(settings: Settings) -> dict[str, Any] | None:
    """The saved plan's body if it may be used now: its key is current and the catalog points where it was made.

    None for anything else (no file, another format, a bad digest, another key, a table that moved on).
    """
    if not _usable(settings):
        return None
    try:
        document = json.loads(plan_path(settings).read_text())
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return None
        body = document.get("body")
        if not isinstance(body, dict) or document.get("digest") != _digest(body):
            return None
        if body.get("key") != plan_key(settings):
            return None
        pointers = catalog_pointers(settings)
        for namespace, table, location in body["tables"]:
            if pointers.get((namespace, table)) != location:
                return None
        return body
    except (OSError, ValueError, TypeError, KeyError, sqlite3.Error) as exc:
        log.debug("view plan not used: %s", exc)
        return None


def _checked(con: duckdb.DuckDBPyConnection, statement: str, prefix: str) -> str:
    """``statement`` if it is one ``CREATE`` statement starting with ``prefix``, else ValueError."""
    if not isinstance(statement, str) or not statement.startswith(prefix):
        raise ValueError("not a plan statement")
    parsed = con.extract_statements(statement)
    if len(parsed) != 1 or parsed[0].type != duckdb.StatementType.CREATE:
        raise ValueError("not one CREATE statement")
    return statement


def _apply(con: duckdb.DuckDBPyConnection, body: dict[str, Any]) -> None:
    """Make the plan's empty tables and views on ``con``.

    Only what a plan holds is run — ``CREATE TABLE "__empty_…"`` and ``CREATE OR REPLACE VIEW``
    statements, one at a time — so a file that is not a plan cannot run anything else.
    """
    for name, columns in body["empty"].items():
        if not name.startswith(_EMPTY_PREFIX):
            raise ValueError("not an empty-table name")
        con.execute(_checked(con, _empty_table_sql(name, columns), "CREATE TABLE "))
    for statement in body["statements"]:
        con.execute(_checked(con, statement, _VIEW_PREFIX))


def open_planned_views(settings: Settings, locked: bool = True) -> duckdb.DuckDBPyConnection | None:
    """The views from the saved plan, as :func:`warehouse.sql.open_views` makes them; None: open them the long way.

    None when there is no usable plan (see :func:`load_plan`) or replaying it fails.
    """
    body = load_plan(settings)
    if body is None:
        return None
    con = connect()
    try:
        _apply(con, body)
        reads = body["reads"]
        if not all(isinstance(p, str) for p in reads):
            raise ValueError("not a list of paths")
        return finish_views(con, settings, reads, locked)
    except (duckdb.Error, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.debug("view plan not replayed: %s", exc)
        con.close()
        return None
