"""``trajlake export``: exportable trajectories → a training set (hf, openai, sharegpt, rl) plus its manifest.

Selection: ``scores.exportable`` (quality ≥ threshold, no security flag, best of its duplicate
cluster) and ``quality ≥ --min-quality``, optionally only sessions started on one day (the
nightly partition). Every text field is redacted again (``producers.redact``) because export
is where data leaves the lakehouse. Files are written only inside the chosen directory; the
manifest lists source snapshot ids, filters, counts, scorer version and each file's sha256, and
a row goes to the ``exports`` table.
"""

from __future__ import annotations

import functools
import hashlib
import json
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
from pipelines.errors import ExportError
from producers.redact import redact_array, redact_text
from quality import SCORER_VERSION
from warehouse.catalog import open_catalog
from warehouse.sql import open_views
from warehouse.tables import DUPLICATES, EXPORTS, FLAGS, SCORES, STEPS, TRAJECTORIES, ensure_table

FORMATS = ("hf", "openai", "sharegpt", "rl")
SYSTEM_PROMPT = "You are an agent working in a sandbox. Use the tools to complete the task."
TOOLS = ("bash", "read_file", "write_file", "run_tests")


@dataclass
class ExportStats:
    """What one export wrote."""

    export_id: str = ""
    format: str = ""
    out_dir: str = ""
    sessions: int = 0
    records: int = 0
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
    if not isinstance(parsed, dict) or parsed == {"command": "..."}:
        parsed = {"command": command or ""}
    return redact_text(json.dumps(parsed, sort_keys=True))


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
            turns.append({"role": "environment", "content": step.get("output") or "", "loss_mask": 0,
                          "exit_code": step.get("exit_code")})  # fmt: skip
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
        f"s.completion FROM trajectories t JOIN scores s USING (session_id) WHERE {where}",
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


def export_training_set(
    settings: Settings,
    fmt: str,
    out_dir: Path | str,
    min_quality: float | None = None,
    day: date | None = None,
    catalog: Catalog | None = None,
    file_name: str | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
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

    Raises:
        ExportError: unknown format, or a path outside ``out_dir``.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    started = time.monotonic()
    catalog = catalog or open_catalog(settings)
    min_quality = settings.quality_min if min_quality is None else min_quality
    root = Path(out_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    data_path = safe_path(root, file_name or f"{fmt}.jsonl")
    manifest_path = safe_path(root, "manifest.json")
    snapshots = _snapshot_ids(catalog, settings)
    stats = ExportStats(export_id=uuid.uuid4().hex, format=fmt, out_dir=str(root.resolve()))
    digest = hashlib.sha256()
    tmp = data_path.with_name(data_path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for session, steps in _sessions(settings, catalog, min_quality, day):
            line = json.dumps(to_record(fmt, session, steps), ensure_ascii=False, default=str) + "\n"
            handle.write(line)
            digest.update(line.encode("utf-8"))
            stats.sessions += 1
            stats.records += 1
    tmp.replace(data_path)
    stats.files = {data_path.name: digest.hexdigest()}
    created = clock()
    manifest = {
        "export_id": stats.export_id,
        "created_at": created.isoformat(),
        "format": fmt,
        "files": [{"path": name, "sha256": sha, "records": stats.records} for name, sha in stats.files.items()],
        "filters": {"exportable": True, "min_quality": min_quality, "day": day.isoformat() if day else None},
        "counts": {"sessions": stats.sessions, "records": stats.records},
        "scorer_version": _scorer_version(settings, catalog),
        "source_snapshots": snapshots,
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    manifest_path.write_text(manifest_text, encoding="utf-8")
    stats.manifest = str(manifest_path)
    row = {
        "export_id": stats.export_id,
        "created_at": created,
        "format": fmt,
        "out_dir": stats.out_dir,
        "partition": day.isoformat() if day else None,
        "min_quality": min_quality,
        "sessions": stats.sessions,
        "records": stats.records,
        "scorer_version": manifest["scorer_version"],
        "files": json.dumps(stats.files, sort_keys=True),
        "manifest_sha256": hashlib.sha256(manifest_text.encode()).hexdigest(),
        "source_snapshots": json.dumps(snapshots, sort_keys=True),
    }
    ensure_table(catalog, settings, EXPORTS.name).append(pa.Table.from_pylist([row], schema=EXPORTS.arrow_schema()))
    stats.seconds = time.monotonic() - started
    return stats


def _scorer_version(settings: Settings, catalog: Catalog) -> str:
    from pipelines.score import SCORED_VERSION

    return ensure_table(catalog, settings, SCORES.name).properties.get(SCORED_VERSION, SCORER_VERSION)
