"""``trajlake export``: exportable trajectories → a training set (hf, openai, sharegpt, rl) plus its manifest.

Selection: ``scores.exportable`` (quality ≥ threshold, no security flag, best of its duplicate
cluster) and ``quality ≥ --min-quality``, optionally only sessions started on one day (the
nightly partition). Every text field is redacted again (``producers.redact``) because export
is where data leaves the lakehouse. Files are written only inside the chosen directory; the
manifest lists source snapshot ids, filters, counts, scorer version and each file's sha256, and
a row goes to the ``exports`` table.

The output directory: system directories (``/``, ``/etc``, ``/usr``, ``$HOME`` itself, …) are
refused, and so is a directory that is not empty unless ``force`` (then only the export's own
files are replaced). While an export writes, it holds ``flock`` on the directory, so two exports
into one directory run one after the other and the manifest always describes the data file
next to it. Every file is written under a unique temporary name created exclusively
(``O_CREAT | O_EXCL | O_NOFOLLOW``, relative to the directory's descriptor), then renamed into
place: a planted symlink is never followed, and a failure leaves no temporary file behind.

A session whose record cannot be built (arguments nested deeper than
:data:`MAX_NESTING`, a record over :data:`MAX_RECORD_BYTES`, a value JSON cannot hold) is left
out, counted in the manifest and recorded in the ``quarantine`` table; the others are exported.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog

from common.settings import Settings
from pipelines.errors import ExportError, RecordError
from pipelines.export.conversation import SYSTEM_PROMPT, TOOLS, Conversation, from_calls, from_steps
from pipelines.export.formats import ATIF_VERSION, FORMATS, RL_SCHEMA, to_record
from pipelines.quarantine import Quarantined, record_quarantine
from producers.redact import redact_array, redact_record, redact_value
from quality import SCORER_VERSION
from warehouse.catalog import open_catalog
from warehouse.sql import open_views
from warehouse.tables import DUPLICATES, EXPORTS, FLAGS, SCORES, STEPS, TRAJECTORIES, ensure_table

#: Split shares (percent of task families, by the sha256 of the family name).
SPLIT_PERCENT = {"train": 80, "validation": 10, "test": 10}
#: Rows per Parquet row group of an ``rl`` export (the memory bound of a Parquet export).
PARQUET_ROWS = 2048
#: Deepest nesting of a step's parsed arguments that an export accepts (deeper: the session is quarantined).
MAX_NESTING = 64
#: Largest JSON-lines record (bytes) an export writes (larger: the session is quarantined).
MAX_RECORD_BYTES = 64 << 20
#: Directories an export never writes into (exactly these), and trees it never writes under.
_SYSTEM_DIRS = frozenset({"/", "/home", "/root", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media", "/boot"})
_SYSTEM_TREES = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/boot",
    "/var/lib",
    "/var/run",
    "/var/log",
)


@dataclass
class ExportStats:
    """What one export wrote."""

    export_id: str = ""
    format: str = ""
    out_dir: str = ""
    sessions: int = 0
    records: int = 0
    quarantined: int = 0  # sessions left out (see the ``quarantine`` table, stage ``export``)
    files: dict[str, str] = field(default_factory=dict)
    manifest: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


def safe_path(root: Path, name: str) -> Path:
    """``root/name`` resolved, refusing anything that would land outside ``root``.

    Raises:
        ExportError: ``name`` is absolute, climbs out with ``..``, or follows a symlink outside.
    """
    root = root.resolve()
    candidate = (root / name).resolve()
    if Path(name).is_absolute() or not candidate.is_relative_to(root) or candidate == root:
        raise ExportError(f"refusing to write {name!r}: outside the export directory {root}")
    return candidate


def _arguments(step: dict[str, Any]) -> str:
    return _normalized_arguments(step.get("arguments"), step.get("command"))


@functools.lru_cache(maxsize=8192)  # agents repeat their commands: most arguments are seen before
def _normalized_arguments(raw: str | None, command: str | None) -> str:
    try:
        parsed = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        parsed = None
    except RecursionError:
        raise RecordError(
            "too_deep", f"arguments nested deeper than Python can parse ({len(raw or '')} chars)"
        ) from None
    if isinstance(parsed, dict | list) and _nesting(parsed) > MAX_NESTING:
        raise RecordError("too_deep", f"arguments nested deeper than {MAX_NESTING} levels")
    if not isinstance(parsed, dict) or parsed == {"command": "..."}:
        parsed = {"command": command or ""}
    return json.dumps(redact_value(parsed), sort_keys=True)  # parsed values: the result stays valid JSON


def _nesting(value: Any) -> int:
    """Depth of nested lists/dicts in ``value``, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_NESTING:
                break
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _snapshot_ids(catalog: Catalog, settings: Settings) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for spec in (TRAJECTORIES, STEPS, SCORES, FLAGS, DUPLICATES):
        snapshot = ensure_table(catalog, settings, spec.name).current_snapshot()
        ids[spec.name] = snapshot.snapshot_id if snapshot else None
    return ids


@dataclass(frozen=True)
class ExportFilters:
    """What an export selects, beyond ``scores.exportable`` minus its own quality threshold.

    Attributes:
        min_quality: quality at least this (applied as given: 0 exports every eligible session).
        day: only sessions started on this UTC day (the nightly partition).
        policy_version: only this policy version.
        task_family: only this task family.
        since: started at or after this instant.
        until: started before this instant.
        split: only this split (``train``, ``validation``, ``test``; by task family, see :func:`split_of`).
        group_complete: only rollout groups whose K attempts all finished and all pass the filters.
    """

    min_quality: float = 0.5
    day: date | None = None
    policy_version: str | None = None
    task_family: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    split: str | None = None
    group_complete: bool = False

    def as_dict(self) -> dict[str, object]:
        """Plain JSON for the manifest."""
        return {
            "eligible": "no security flag, ended, representative of its duplicate cluster",
            "min_quality": self.min_quality,
            "day": self.day.isoformat() if self.day else None,
            "policy_version": self.policy_version,
            "task_family": self.task_family,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "split": self.split,
            "group_complete": self.group_complete,
        }


def split_of(task_family: str | None) -> str:
    """The split of a task family: sha256 of the family name, 80 % train, 10 % validation, 10 % test.

    Deterministic and by family, so every session of a family lands in one split (no family in two).
    """
    bucket = int.from_bytes(hashlib.sha256((task_family or "").encode()).digest()[:8], "big") % 100
    return (
        "train" if bucket < SPLIT_PERCENT["train"] else "validation" if bucket < 100 - SPLIT_PERCENT["test"] else "test"
    )


def _selection(filters: ExportFilters) -> tuple[str, dict[str, Any]]:
    """The WHERE clause choosing sessions (the quality threshold is the filter's, not ``exportable``'s)."""
    where = [
        "NOT s.security_flagged",
        "s.failure_cause IS DISTINCT FROM 'still_running'",
        "t.status <> 'running'",
        "s.session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)",
        "s.quality >= $q",
    ]
    params: dict[str, Any] = {"q": filters.min_quality}
    if filters.day:
        where.append("CAST(t.started_at AS DATE) = $day")
        params["day"] = filters.day
    if filters.policy_version is not None:
        where.append("t.policy_version = $pv")
        params["pv"] = filters.policy_version
    if filters.task_family is not None:
        where.append("coalesce(t.task_family, s.task_family, t.task_id) = $tf")
        params["tf"] = filters.task_family
    if filters.since:
        where.append("t.started_at >= $since")
        params["since"] = filters.since
    if filters.until:
        where.append("t.started_at < $until")
        params["until"] = filters.until
    return " AND ".join(where), params


def _merge(
    sessions: list[dict[str, Any]], reader: Any, column: int, redact: tuple[int, ...] = ()
) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``reader`` (ordered by session_id) grouped per session of ``sessions``, in that order.

    Memory is bounded by one Arrow batch plus the rows of the sessions it spans.
    """
    grouped: dict[str, list[dict[str, Any]]] = {}
    position = 0
    for batch in reader:
        for index in redact:
            batch = batch.set_column(index, batch.schema.field(index).name, redact_array(batch.column(index)))
        rows = batch.to_pylist()
        for row in rows:
            grouped.setdefault(row["session_id"], []).append(row)
        last = rows[-1]["session_id"] if rows else ""
        while position < len(sessions) and sessions[position]["session_id"] < last:
            yield grouped.pop(sessions[position]["session_id"], [])
            position += 1
    for session in sessions[position:]:
        yield grouped.pop(session["session_id"], [])


class _Blobs:
    """Model-call content another session emitted (the host stores each text once), looked up and cached."""

    def __init__(self, con: Any, capacity: int = 4096) -> None:
        self.con, self.capacity = con, capacity
        self.cache: dict[str, str] = {}

    def __call__(self, refs: Iterator[str] | list[str]) -> dict[str, str]:
        wanted = list(refs)
        missing = [r for r in wanted if r not in self.cache]
        if missing:
            rows = self.con.execute(
                "SELECT DISTINCT b.sha256, b.text FROM (SELECT unnest(agent_input.model_call.blobs) AS b FROM events "
                "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL) WHERE b.sha256 IN "
                "(SELECT unnest($refs))",
                {"refs": missing},
            ).fetchall()
            if len(self.cache) > self.capacity:
                self.cache.clear()
            self.cache.update({sha: text for sha, text in rows})
        return {r: self.cache[r] for r in wanted if r in self.cache}


def _sessions(
    settings: Settings, catalog: Catalog, filters: ExportFilters, weights: dict[str, float], batch_rows: int = 20_000
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], _Blobs]]:
    """Chosen sessions in ``session_id`` order with their steps and model calls, text fields redacted.

    Steps and model calls stream from DuckDB in Arrow batches ordered like the sessions and are
    merged on the fly, so memory is bounded by a batch, not by the export's size.
    """
    con = open_views(settings, catalog)
    where, params = _selection(filters)
    con.execute(
        "CREATE TABLE chosen AS SELECT t.session_id, t.task_id, t.task_type, t.instruction, s.quality, "
        "s.completion, s.flags, coalesce(t.task_family, s.task_family, t.task_id) AS task_family, t.policy_version, "
        "t.group_id, t.attempt, t.agent_name, t.agent_version, t.agent_model, t.status, t.exit_reason, t.reward, "
        "t.input_tokens, t.cached_tokens, t.output_tokens, t.cost_usd "
        f"FROM trajectories t JOIN scores s USING (session_id) WHERE {where}",
        params,
    )
    if filters.group_complete:
        # a group is whole when every attempt 0..K-1 exists, none is running and all K were chosen
        con.execute(
            "DELETE FROM chosen WHERE group_id IS NULL OR group_id NOT IN (SELECT g.group_id FROM (SELECT group_id, "
            "count(DISTINCT attempt) AS k, max(attempt) AS top, bool_and(status <> 'running') AS done, count(*) AS n "
            "FROM trajectories WHERE group_id IS NOT NULL GROUP BY group_id) g JOIN (SELECT group_id, count(*) AS n "
            "FROM chosen GROUP BY group_id) c USING (group_id) WHERE g.done AND g.k = g.top + 1 AND c.n = g.n)"
        )
    chosen = con.sql(
        "SELECT c.*, f.flag_list, sub.submission FROM chosen c "
        "LEFT JOIN (SELECT session_id, list(struct_pack(flag := flag, flag_class := flag_class, severity := severity) "
        "ORDER BY flag) AS flag_list FROM flags WHERE session_id IN (SELECT session_id FROM chosen) "
        "GROUP BY session_id) f USING (session_id) "
        "LEFT JOIN (SELECT e.session_id, arg_max(fb.env_feedback.output, fb.seq) AS submission FROM events e "
        "JOIN events fb ON fb.event_id = e.extra['submission_event_id'] WHERE e.event_type = 'session_end' "
        "AND e.session_id IN (SELECT session_id FROM chosen) GROUP BY e.session_id) sub USING (session_id) "
        "ORDER BY session_id"
    ).to_arrow_table()
    for name in ("instruction", "submission"):
        chosen = chosen.set_column(chosen.schema.get_field_index(name), name, redact_array(chosen.column(name)))
    sessions = []
    for session in chosen.to_pylist():
        session["split"] = split_of(session["task_family"])
        if filters.split and session["split"] != filters.split:
            continue
        flags = session.pop("flag_list") or []
        for flag in flags:
            flag["weight"] = weights.get(flag["flag"], 1.0)
        session["flag_list"] = flags
        session["weight"] = min((flag["weight"] for flag in flags), default=1.0)
        sessions.append(session)
    con.execute(
        "DELETE FROM chosen WHERE session_id NOT IN (SELECT unnest($ids))", {"ids": [s["session_id"] for s in sessions]}
    )
    # one cursor per open stream: a query on a connection would end the stream still pending on it
    ids = [s["session_id"] for s in sessions]
    steps = con.sql(
        "SELECT session_id, step_index, tool_name, tool_call_id, arguments, command, thought, output, exit_code, "
        "ts "
        "FROM steps WHERE session_id IN (SELECT session_id FROM chosen) ORDER BY session_id, step_index"
    ).to_arrow_reader(batch_rows)
    # another connection per open stream: a query on a connection ends the stream pending on it
    calls = (
        open_views(settings, catalog)
        .sql(
            "SELECT session_id, ts AS _ts, agent_input.model_call AS call FROM events WHERE event_type = 'agent_input' "
            "AND agent_input.model_call IS NOT NULL AND session_id IN (SELECT unnest($ids)) "
            "ORDER BY session_id, seq",
            params={"ids": ids},
        )
        .to_arrow_reader(max(batch_rows // 20, 256))
    )
    step_groups = _merge(sessions, steps, 0, redact=(6, 7))
    call_groups = _merge(sessions, calls, 0)
    lookup = _Blobs(open_views(settings, catalog))
    for session, own_steps, own_calls in zip(sessions, step_groups, call_groups, strict=True):
        yield session, own_steps, [{**row["call"], "_ts": row["_ts"]} for row in own_calls], lookup


def _refused_directory(path: Path, settings: Settings) -> str | None:
    """Why ``path`` (resolved) must not receive an export, or None."""
    text = str(path)
    if text in _SYSTEM_DIRS or any(text == tree or text.startswith(tree + "/") for tree in _SYSTEM_TREES):
        return "a system directory"
    if path == Path.home().resolve():
        return "your home directory itself; choose a directory inside it"
    if path == settings.home_dir.resolve():
        return "TRAJLAKE_HOME itself; choose a directory inside it"
    return None


def _open_out_dir(out_dir: Path | str, settings: Settings) -> tuple[Path, int]:
    """Create (if needed) and open the export directory; returns its resolved path and a descriptor.

    Raises:
        ExportError: a system directory, an existing file, or a directory that cannot be created.
    """
    root = Path(out_dir).expanduser()
    resolved = root.resolve()
    why = _refused_directory(resolved, settings)
    if why:
        raise ExportError(f"refusing to export into {resolved}: {why}")
    if resolved.exists() and not resolved.is_dir():
        raise ExportError(f"--out {root}: exists and is not a directory")
    try:
        resolved.mkdir(mode=0o700, parents=True, exist_ok=True)  # an export is owner-only
        # O_NOFOLLOW: the checked directory itself, not a symlink swapped in since the check
        return resolved, os.open(resolved, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ExportError(f"--out {root}: cannot create or open the directory ({exc.strerror or exc})") from exc


class _ExclusiveFile:
    """A file written under a unique temporary name in a directory, then renamed to ``name``.

    The temporary file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the
    directory's descriptor: nothing pre-planted (a symlink, a file of the same name) is
    opened. ``rename`` replaces ``name`` itself, never what a symlink there points to.
    """

    def __init__(self, dir_fd: int, name: str, binary: bool = False) -> None:
        self.dir_fd, self.name = dir_fd, name
        self.tmp_name = f".{name}.{uuid.uuid4().hex}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.tmp_name, flags, 0o600, dir_fd=dir_fd)
        self.handle: Any = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")

    def commit(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.tmp_name, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def discard(self) -> None:
        self.handle.close()
        try:
            os.unlink(self.tmp_name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass


def _write_file(dir_fd: int, name: str, text: str) -> None:
    out = _ExclusiveFile(dir_fd, name)
    try:
        out.handle.write(text)
        out.commit()
    except BaseException:
        out.discard()
        raise


def _record(
    fmt: str, session: dict[str, Any], steps: list[dict[str, Any]], calls: list[dict[str, Any]], lookup: _Blobs
) -> dict[str, Any]:
    """The redacted record of one session (recorded conversation when its model calls were recorded).

    Raises:
        RecordError: the record is too deep, a model call cannot be rebuilt, or a value JSON cannot hold.
    """
    try:
        conversation = from_calls(calls, lookup, steps) if calls else None
        if conversation is None:
            conversation = from_steps(session, steps, _arguments)
        # every string of the record once more, whatever the producer missed (parsed JSON stays JSON)
        return dict(redact_record(to_record(fmt, session, conversation)))
    except RecursionError:
        raise RecordError("too_deep", "record nested deeper than Python can serialize") from None


def _record_line(record: dict[str, Any]) -> str:
    """The JSON line of one record.

    Raises:
        RecordError: the record is too deep, too large or not representable as JSON.
    """
    try:
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
    except RecursionError:
        raise RecordError("too_deep", "record nested deeper than Python can serialize") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise RecordError("unrepresentable", f"{type(exc).__name__}: {exc}") from exc
    if len(line) > MAX_RECORD_BYTES:  # characters ≤ bytes: a cheap first check
        raise RecordError("too_large", f"record of {len(line)} characters exceeds {MAX_RECORD_BYTES} bytes")
    return line


def export_training_set(
    settings: Settings,
    fmt: str,
    out_dir: Path | str,
    min_quality: float | None = None,
    day: date | None = None,
    catalog: Catalog | None = None,
    file_name: str | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    force: bool = False,
    filters: ExportFilters | None = None,
    parquet: bool = False,
) -> ExportStats:
    """Write ``out_dir/<file>.jsonl`` (or ``.parquet``) and ``out_dir/manifest.json``, and record the export.

    Args:
        settings: trajlake settings (default threshold).
        fmt: one of :data:`FORMATS`.
        out_dir: target directory (created); nothing is written outside it.
        min_quality: threshold; ``settings.quality_min`` by default.
        day: only sessions started on this UTC day (the nightly partition).
        catalog: Iceberg catalog; opened from settings by default.
        file_name: data file name inside ``out_dir`` (default ``<fmt>.jsonl``).
        clock: the export time (tests).
        force: write into a directory that is not empty (replacing the export's own files).
        filters: policy version, task family, time range, split, complete groups (``min_quality``
            and ``day`` above take precedence when given).
        parquet: write Parquet (``rl`` only: one typed row per session) instead of JSON lines.

    Returns:
        :class:`ExportStats`; ``quarantined`` counts sessions left out (``quarantine`` table).

    Raises:
        ExportError: unknown format, a path outside ``out_dir``, a refused or non-empty directory,
            ``out_dir`` is a file, or a file could not be written.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    started = time.monotonic()
    catalog = catalog or open_catalog(settings)
    if parquet and fmt != "rl":
        raise ExportError(f"--parquet is for --format rl (typed columns); {fmt} is written as JSON lines")
    filters = filters or ExportFilters(min_quality=settings.quality_min)
    if min_quality is not None or day is not None:
        filters = replace(
            filters, min_quality=filters.min_quality if min_quality is None else min_quality, day=day or filters.day
        )
    if filters.split is not None and filters.split not in SPLIT_PERCENT:
        raise ExportError(f"unknown split {filters.split!r}; choose one of {', '.join(SPLIT_PERCENT)}")
    min_quality, day = filters.min_quality, filters.day
    root, dir_fd = _open_out_dir(out_dir, settings)
    try:
        # Names, not resolved paths: whatever is planted under them (a symlink) is replaced, never followed.
        name = file_name or f"{fmt}.{'parquet' if parquet else 'jsonl'}"
        if "/" in name or "\0" in name or name in ("", ".", "..") or name == "manifest.json":
            raise ExportError(f"refusing to write {name!r}: not a plain file name inside {root}")
        data_path, manifest_path = root / name, root / "manifest.json"
        fcntl.flock(dir_fd, fcntl.LOCK_EX)  # a second export into this directory waits for this one
        if not force and os.listdir(dir_fd):
            raise ExportError(f"{root} is not empty; choose an empty directory or pass --force to replace the export")
        stats = ExportStats(export_id=uuid.uuid4().hex, format=fmt, out_dir=str(root))
        try:
            manifest_text, snapshots = _write_export(
                settings, catalog, fmt, filters, dir_fd, data_path, manifest_path, stats, clock, parquet
            )
        except OSError as exc:
            raise ExportError(f"cannot write the export into {root}: {exc.strerror or exc}") from exc
    finally:
        os.close(dir_fd)  # also releases the flock
    row = {
        "export_id": stats.export_id,
        "created_at": datetime.fromisoformat(json.loads(manifest_text)["created_at"]),
        "format": fmt,
        "out_dir": stats.out_dir,
        "partition": day.isoformat() if day else None,
        "min_quality": min_quality,
        "sessions": stats.sessions,
        "records": stats.records,
        "scorer_version": json.loads(manifest_text)["scorer_version"],
        "files": json.dumps(stats.files, sort_keys=True),
        "manifest_sha256": hashlib.sha256(manifest_text.encode()).hexdigest(),
        "source_snapshots": json.dumps(snapshots, sort_keys=True),
    }
    ensure_table(catalog, settings, EXPORTS.name).append(pa.Table.from_pylist([row], schema=EXPORTS.arrow_schema()))
    stats.seconds = time.monotonic() - started
    return stats


def _write_export(
    settings: Settings,
    catalog: Catalog,
    fmt: str,
    filters: ExportFilters,
    dir_fd: int,
    data_path: Path,
    manifest_path: Path,
    stats: ExportStats,
    clock: Callable[[], datetime],
    parquet: bool,
) -> tuple[str, dict[str, int | None]]:
    """Write the data file and then the manifest (each through :class:`_ExclusiveFile`); returns the manifest."""
    snapshots = _snapshot_ids(catalog, settings)
    scoring = _scoring(settings, catalog)
    governance = scoring.get("governance") if isinstance(scoring.get("governance"), dict) else {}
    weights = {
        str(name): float(policy.get("weight") if policy.get("weight") is not None else 1.0)
        for name, policy in (governance or {}).items()
        if isinstance(policy, dict)
    }
    digest = hashlib.sha256()
    quarantined: list[Quarantined] = []
    splits: dict[str, int] = {}
    token_level = 0
    out = _ExclusiveFile(dir_fd, data_path.name, binary=parquet)
    writer = _ParquetSink(out, digest) if parquet else None
    try:
        for session, steps, calls, lookup in _sessions(settings, catalog, filters, weights):
            try:
                record = _record(fmt, session, steps, calls, lookup)
                line = _record_line(record)
            except RecordError as exc:
                quarantined.append(Quarantined(session["session_id"], "export", exc.reason, "skipped", str(exc)))
                continue
            if writer is not None:
                writer.add(record)
            else:
                out.handle.write(line)
                digest.update(line.encode("utf-8"))
            stats.sessions += 1
            stats.records += 1
            splits[session["split"]] = splits.get(session["split"], 0) + 1
            token_level += bool(record.get("has_token_ids"))
        if writer is not None:
            writer.close()
        out.commit()
    except BaseException:
        out.discard()
        raise
    stats.quarantined = len(quarantined)
    if quarantined:
        record_quarantine(catalog, settings, quarantined, run_id=stats.export_id)
    stats.files = {data_path.name: digest.hexdigest()}
    created = clock()
    manifest = {
        "export_id": stats.export_id,
        "created_at": created.isoformat(),
        "format": fmt,
        "file_format": "parquet" if parquet else "jsonl",
        "files": [{"path": name, "sha256": sha, "records": stats.records} for name, sha in stats.files.items()],
        "filters": {"exportable": True, **filters.as_dict()},
        "splits": {"by": "task_family", "hash": "sha256", "percent": SPLIT_PERCENT},
        "counts": {
            "sessions": stats.sessions,
            "records": stats.records,
            "quarantined": stats.quarantined,
            "per_split": splits,
            "with_token_ids": token_level,
        },
        "scorer_version": _scorer_version(settings, catalog),
        "scoring": scoring,
        "source_snapshots": snapshots,
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _write_file(dir_fd, manifest_path.name, manifest_text)
    stats.manifest = str(manifest_path)
    return manifest_text, snapshots


class _ParquetSink:
    """``rl`` records into a Parquet file in row groups of :data:`PARQUET_ROWS` (memory bounded by one group)."""

    def __init__(self, out: _ExclusiveFile, digest: Any) -> None:
        self.out, self.digest = out, digest
        self.rows: list[dict[str, Any]] = []
        self.writer = pq.ParquetWriter(_HashingFile(out.handle, digest), RL_SCHEMA, compression="zstd")

    def add(self, record: dict[str, Any]) -> None:
        self.rows.append(record)
        if len(self.rows) >= PARQUET_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=RL_SCHEMA))
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


class _HashingFile:
    """A write-only binary file that also feeds a sha256 (the manifest's digest of the Parquet bytes)."""

    def __init__(self, handle: Any, digest: Any) -> None:
        self.handle, self.digest = handle, digest
        self.closed = False

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return int(self.handle.write(data))

    def flush(self) -> None:
        self.handle.flush()

    def close(self) -> None:  # the exclusive file is committed (fsync, rename) by its owner
        self.closed = True

    def tell(self) -> int:
        return int(self.handle.tell())


def _scoring(settings: Settings, catalog: Catalog) -> dict[str, object]:
    """Weights, thresholds and the governance table the exported scores were computed with."""
    from pipelines.score import scoring_manifest

    return scoring_manifest(settings, catalog)


def _scorer_version(settings: Settings, catalog: Catalog) -> str:
    from pipelines.score import SCORED_VERSION

    return ensure_table(catalog, settings, SCORES.name).properties.get(SCORED_VERSION, SCORER_VERSION)


__all__ = [
    "ATIF_VERSION",
    "FORMATS",
    "MAX_NESTING",
    "MAX_RECORD_BYTES",
    "RL_SCHEMA",
    "SPLIT_PERCENT",
    "SYSTEM_PROMPT",
    "TOOLS",
    "Conversation",
    "ExportError",
    "ExportFilters",
    "ExportStats",
    "export_training_set",
    "safe_path",
    "split_of",
    "to_record",
]
