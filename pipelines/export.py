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
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog

from common.settings import Settings
from pipelines.errors import ExportError, RecordError
from pipelines.quarantine import Quarantined, record_quarantine
from producers.redact import redact_array, redact_record, redact_value
from quality import SCORER_VERSION
from warehouse.catalog import open_catalog
from warehouse.sql import open_views
from warehouse.tables import DUPLICATES, EXPORTS, FLAGS, SCORES, STEPS, TRAJECTORIES, ensure_table

FORMATS = ("hf", "openai", "sharegpt", "rl")
SYSTEM_PROMPT = "You are an agent working in a sandbox. Use the tools to complete the task."
TOOLS = ("bash", "read_file", "write_file", "run_tests")
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


def _tool_spec(name: str) -> dict[str, Any]:
    params = {
        "bash": {"command": {"type": "string"}},
        "read_file": {"path": {"type": "string"}},
        "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
        "run_tests": {"command": {"type": "string"}},
    }.get(name, {"command": {"type": "string"}})
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The sandbox's {name} tool.",
            "parameters": {"type": "object", "properties": params, "required": sorted(params)},
        },
    }


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


def chat_messages(session: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style chat: system, user instruction, then assistant tool call / tool result pairs.

    Text fields (instruction, thought, output) are expected redacted already (``_sessions``
    does it column by column); tool-call arguments are normalized and redacted here.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT, "tool_calls": None, "tool_call_id": None},
        {"role": "user", "content": session.get("instruction") or "", "tool_calls": None, "tool_call_id": None},
    ]
    for i, step in enumerate(steps):
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": step.get("thought") or "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": step.get("tool_name") or "bash", "arguments": _arguments(step)},
                    }
                ],
                "tool_call_id": None,
            }
        )
        messages.append(
            {"role": "tool", "content": step.get("output") or "", "tool_calls": None, "tool_call_id": call_id}
        )
    return messages


def _strip_nulls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def to_record(fmt: str, session: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One JSON-lines record of ``session`` in format ``fmt`` (text fields redacted by the caller)."""
    meta = {
        "session_id": session["session_id"],
        "task_id": session["task_id"],
        "task_type": session["task_type"],
        "quality": session["quality"],
        "completion": session["completion"],
        # suspicions are exported with the record (down-weighted, not dropped): the consumer decides
        "flags": [flag for flag in (session.get("flags") or "").split(",") if flag],
    }
    if fmt == "hf":
        # a fixed key set per message so every row has one Arrow type in datasets
        return {"messages": chat_messages(session, steps), **meta}
    if fmt == "openai":
        used = sorted({s.get("tool_name") or "bash" for s in steps} | set(TOOLS))
        return {"messages": _strip_nulls(chat_messages(session, steps)), "tools": [_tool_spec(t) for t in used]}
    if fmt == "sharegpt":
        conversations = [
            {"from": "system", "value": SYSTEM_PROMPT},
            {"from": "human", "value": session.get("instruction") or ""},
        ]
        for step in steps:
            call = {"name": step.get("tool_name") or "bash", "arguments": json.loads(_arguments(step))}
            conversations.append({"from": "function_call", "value": json.dumps(call, sort_keys=True)})
            conversations.append({"from": "observation", "value": step.get("output") or ""})
        return {"conversations": conversations, **meta}
    if fmt == "rl":
        turns = []
        for step in steps:
            # json.dumps of {"arguments": ..., "tool": ...} with sorted keys, without re-parsing the arguments
            action = f'{{"arguments": {_arguments(step)}, "tool": {json.dumps(step.get("tool_name"))}}}'
            turns.append({"role": "assistant", "content": action, "loss_mask": 1})
            turns.append(
                {
                    "role": "environment",
                    "content": step.get("output") or "",
                    "loss_mask": 0,
                    "exit_code": step.get("exit_code"),
                }
            )
        return {
            "prompt": session.get("instruction") or "",
            "turns": turns,
            "action_mask": [t["loss_mask"] for t in turns],
            "reward": session["completion"],
            **meta,
        }
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _snapshot_ids(catalog: Catalog, settings: Settings) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for spec in (TRAJECTORIES, STEPS, SCORES, FLAGS, DUPLICATES):
        snapshot = ensure_table(catalog, settings, spec.name).current_snapshot()
        ids[spec.name] = snapshot.snapshot_id if snapshot else None
    return ids


def _sessions(
    settings: Settings, catalog: Catalog, min_quality: float, day: date | None, batch_rows: int = 20_000
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Chosen sessions in ``session_id`` order with their steps, text fields redacted.

    Steps stream from DuckDB in Arrow batches ordered like the sessions and are
    merged on the fly, so memory is bounded by a batch, not by the export's size.
    """
    con = open_views(settings, catalog)
    where = "s.exportable AND s.quality >= $q" + (" AND CAST(t.started_at AS DATE) = $day" if day else "")
    params: dict[str, Any] = {"q": min_quality}
    if day:
        params["day"] = day
    con.execute(
        "CREATE TEMP TABLE chosen AS SELECT t.session_id, t.task_id, t.task_type, t.instruction, s.quality, "
        f"s.completion, s.flags FROM trajectories t JOIN scores s USING (session_id) WHERE {where}",
        params,
    )
    chosen = con.sql("SELECT * FROM chosen ORDER BY session_id").to_arrow_table()
    chosen = chosen.set_column(3, "instruction", redact_array(chosen.column("instruction")))
    sessions = chosen.to_pylist()
    reader = con.sql(
        "SELECT session_id, step_index, tool_name, arguments, command, thought, output, exit_code FROM steps "
        "WHERE session_id IN (SELECT session_id FROM chosen) ORDER BY session_id, step_index"
    ).to_arrow_reader(batch_rows)
    grouped: dict[str, list[dict[str, Any]]] = {}  # steps of sessions not yet yielded
    position = 0
    for batch in reader:
        batch = batch.set_column(5, "thought", redact_array(batch.column(5)))
        batch = batch.set_column(6, "output", redact_array(batch.column(6)))
        rows = batch.to_pylist()
        for row in rows:
            grouped.setdefault(row["session_id"], []).append(row)
        # Both sides are ordered by session_id: sessions before the batch's last one are complete.
        last = rows[-1]["session_id"] if rows else ""
        while position < len(sessions) and sessions[position]["session_id"] < last:
            yield sessions[position], grouped.pop(sessions[position]["session_id"], [])
            position += 1
    for session in sessions[position:]:
        yield session, grouped.pop(session["session_id"], [])


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

    def __init__(self, dir_fd: int, name: str) -> None:
        self.dir_fd, self.name = dir_fd, name
        self.tmp_name = f".{name}.{uuid.uuid4().hex}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.handle = os.fdopen(os.open(self.tmp_name, flags, 0o600, dir_fd=dir_fd), "w", encoding="utf-8")

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


def _record_line(fmt: str, session: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    """The JSON line of one session.

    Raises:
        RecordError: the record is too deep, too large or not representable as JSON.
    """
    try:
        # every string of the record once more, whatever the producer missed (parsed JSON stays JSON)
        line = json.dumps(redact_record(to_record(fmt, session, steps)), ensure_ascii=False, default=str) + "\n"
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
) -> ExportStats:
    """Write ``out_dir/<file>.jsonl`` and ``out_dir/manifest.json``, and record the export.

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
    min_quality = settings.quality_min if min_quality is None else min_quality
    root, dir_fd = _open_out_dir(out_dir, settings)
    try:
        # Names, not resolved paths: whatever is planted under them (a symlink) is replaced, never followed.
        name = file_name or f"{fmt}.jsonl"
        if "/" in name or "\0" in name or name in ("", ".", "..") or name == "manifest.json":
            raise ExportError(f"refusing to write {name!r}: not a plain file name inside {root}")
        data_path, manifest_path = root / name, root / "manifest.json"
        fcntl.flock(dir_fd, fcntl.LOCK_EX)  # a second export into this directory waits for this one
        if not force and os.listdir(dir_fd):
            raise ExportError(f"{root} is not empty; choose an empty directory or pass --force to replace the export")
        stats = ExportStats(export_id=uuid.uuid4().hex, format=fmt, out_dir=str(root))
        try:
            manifest_text, snapshots = _write_export(
                settings, catalog, fmt, min_quality, day, dir_fd, data_path, manifest_path, stats, clock
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
    min_quality: float,
    day: date | None,
    dir_fd: int,
    data_path: Path,
    manifest_path: Path,
    stats: ExportStats,
    clock: Callable[[], datetime],
) -> tuple[str, dict[str, int | None]]:
    """Write the data file and then the manifest (each through :class:`_ExclusiveFile`); returns the manifest."""
    snapshots = _snapshot_ids(catalog, settings)
    digest = hashlib.sha256()
    quarantined: list[Quarantined] = []
    out = _ExclusiveFile(dir_fd, data_path.name)
    try:
        for session, steps in _sessions(settings, catalog, min_quality, day):
            try:
                line = _record_line(fmt, session, steps)
            except RecordError as exc:
                quarantined.append(Quarantined(session["session_id"], "export", exc.reason, "skipped", str(exc)))
                continue
            out.handle.write(line)
            digest.update(line.encode("utf-8"))
            stats.sessions += 1
            stats.records += 1
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
        "files": [{"path": name, "sha256": sha, "records": stats.records} for name, sha in stats.files.items()],
        "filters": {"exportable": True, "min_quality": min_quality, "day": day.isoformat() if day else None},
        "counts": {"sessions": stats.sessions, "records": stats.records, "quarantined": stats.quarantined},
        "scorer_version": _scorer_version(settings, catalog),
        "scoring": _scoring(settings, catalog),
        "source_snapshots": snapshots,
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _write_file(dir_fd, manifest_path.name, manifest_text)
    stats.manifest = str(manifest_path)
    return manifest_text, snapshots


def _scoring(settings: Settings, catalog: Catalog) -> dict[str, object]:
    """Weights, thresholds and the governance table the exported scores were computed with."""
    from pipelines.score import scoring_manifest

    return scoring_manifest(settings, catalog)


def _scorer_version(settings: Settings, catalog: Catalog) -> str:
    from pipelines.score import SCORED_VERSION

    return ensure_table(catalog, settings, SCORES.name).properties.get(SCORED_VERSION, SCORER_VERSION)
