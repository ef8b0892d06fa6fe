"""The export stage, top to bottom: select, build each record, write the splits, swap the directory in."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from common.prices import PriceTable
from common.progress import Progress
from pipelines.errors import ExportError, RecordError
from pipelines.export._files import _ExclusiveFile, _write_file, open_subdirectory
from pipelines.export.atif import atif_judgement
from pipelines.export.conversation import from_calls, from_steps
from pipelines.export.formats import FORMATS as RECORD_FORMATS
from pipelines.export.layout import FeatureSketch, Target, card, checkpoint, commit, discard, open_target
from pipelines.export.options import ExportOptions
from pipelines.export.records import to_records
from pipelines.export.rl import RL_SCHEMA
from pipelines.export.select import SPLIT_PERCENT, ExportFilters, _Blobs, _sessions
from pipelines.export.trainers import TRAINER_FORMATS, trainer_records
from pipelines.intake.quarantine import Quarantined, record_quarantine
from producers.redact import redact_record, redact_value
from quality import SCORER_VERSION
from warehouse.lakehouse import Lakehouse
from warehouse.tables import DUPLICATES, EXPORTS, FLAGS, SCORES, STEPS, TRAJECTORIES

#: Every export format: the per-session record formats and the trainers' own (verl, skyrl).
FORMATS = RECORD_FORMATS + TRAINER_FORMATS
#: Formats whose records are RL samples: a session without a successful model call is never one.
EPISODE_FORMATS = ("rl", *TRAINER_FORMATS)

#: Rows per Parquet row group of an ``rl`` export (the memory bound of a Parquet export).
PARQUET_ROWS = 2048
#: Deepest nesting of a step's parsed arguments that an export accepts (deeper: the session is quarantined).
MAX_NESTING = 64
#: Largest JSON-lines record (bytes) an export writes (larger: the session is quarantined).
MAX_RECORD_BYTES = 64 << 20


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
    considered: int = 0  # sessions in the export's scope (day, policy, family, time, split)
    left_out: dict[str, Any] = field(default_factory=dict)  # rule -> sessions it left out (outcome: by outcome)
    per_origin: dict[str, int] = field(default_factory=dict)  # sessions exported per origin

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)

    def left_out_summary(self) -> str:
        """``rule=n`` for each rule that left something out (outcomes as ``outcome:<name>=n``)."""
        parts = []
        for rule, value in self.left_out.items():
            items = value.items() if isinstance(value, dict) else [("", value)]
            parts += [f"{rule}{':' + k if k else ''}={n}" for k, n in items if n]
        return ", ".join(parts) or "nothing"


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


def _snapshot_ids(lake: Lakehouse) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for spec in (TRAJECTORIES, STEPS, SCORES, FLAGS, DUPLICATES):
        snapshot = lake.table(spec.name).current_snapshot()
        ids[spec.name] = snapshot.snapshot_id if snapshot else None
    return ids


def _records(
    fmt: str,
    session: dict[str, Any],
    steps: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    lookup: _Blobs,
    prices: PriceTable,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The redacted records of one session — one, one per rl segment, or (trainer formats) one per
    segment — and, for ``atif``, the line of its scores file (what this lake concluded about it).

    Raises:
        RecordError: the record is too deep, a model call cannot be rebuilt, a value JSON cannot hold, or an
            session's model calls all failed (``no_model_call``: nothing was sampled; any format).
    """
    if calls and not any(c.get("status") == "ok" for c in calls):
        # in every format and token mode: nothing was sampled, so there is no agent turn to learn from
        # (an SFT record rebuilt from the steps would be the task statement and nothing of the model)
        raise RecordError("no_model_call", "every model call of the session failed: nothing was sampled")
    try:
        try:
            conversation = from_calls(calls, lookup, steps, session.get("agent_model")) if calls else None
        except RecordError as exc:
            if exc.reason != "bad_model_call":
                raise
            # the producer redacted a secret inside a recorded message, so its sha256 no longer matches:
            # the steps still tell the session (prompt_source says it is reconstructed)
            conversation = None
        if conversation is None:
            conversation = from_steps(session, steps, _arguments)
        built = (
            trainer_records(fmt, session, conversation)
            if fmt in TRAINER_FORMATS
            else to_records(fmt, session, conversation, prices)
        )
        records = redacted_records(fmt, session, conversation, built, prices)
        judgement = dict(redact_record(atif_judgement(session, conversation))) if fmt == "atif" else None
        return records, judgement
    except RecursionError:
        raise RecordError("too_deep", "record nested deeper than Python can serialize") from None


#: Fields of an export record holding token ids (``rl``, verl, SkyRL).
_ID_FIELDS = ("prompt_ids", "response_ids")


def redacted_records(
    fmt: str, session: dict[str, Any], conversation: Any, built: list[dict[str, Any]], prices: PriceTable
) -> list[dict[str, Any]]:
    """Every string of ``built`` redacted once more (whatever the producer missed; parsed JSON stays JSON).

    Where that changed the text of records carrying token ids, the ids still spell what was redacted (a
    producer that did not redact a reply and recorded no token strings for the gate to check): an ``rl``
    session falls back to its message form (no ids), a trainer format, which needs them, leaves it out.

    Raises:
        RecordError: ``secret_in_token_ids``: a trainer record's ids spell text redaction removed.
    """
    records = [dict(redact_record(r)) for r in built]
    if not any(r.get(name) for r in built for name in _ID_FIELDS):
        return records
    messages = getattr(conversation, "messages", None) or []
    if records == built and redact_value(messages) == messages:  # a trainer record carries ids, not text
        return records
    if fmt in TRAINER_FORMATS or not getattr(conversation, "calls", None):
        raise RecordError("secret_in_token_ids", "redaction changed text the session's token ids spell")
    bare = [replace(c, prompt_token_ids=None, completion_token_ids=[], logprobs=[]) for c in conversation.calls]
    rebuilt = to_records(fmt, session, replace(conversation, calls=bare), prices)
    return [dict(redact_record(r)) for r in rebuilt]


def _record_line(record: dict[str, Any], sort_keys: bool = False) -> str:
    """The JSON line of one record (``sort_keys``: canonical key order, for byte-stable ATIF).

    Raises:
        RecordError: the record is too deep, too large or not representable as JSON.
    """
    try:
        line = json.dumps(record, ensure_ascii=False, default=str, sort_keys=sort_keys)
        # U+2028/2029 are line breaks to str.splitlines and many JSON-lines readers: escaped, same value
        line = line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n"
    except RecursionError:
        raise RecordError("too_deep", "record nested deeper than Python can serialize") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise RecordError("unrepresentable", f"{type(exc).__name__}: {exc}") from exc
    if len(line) > MAX_RECORD_BYTES:  # characters ≤ bytes: a cheap first check
        raise RecordError("too_large", f"record of {len(line)} characters exceeds {MAX_RECORD_BYTES} bytes")
    return line


def export_training_set(
    lake: Lakehouse,
    fmt: str,
    out_dir: Path | str,
    min_quality: float | None = None,
    day: date | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    force: bool = False,
    filters: ExportFilters | None = None,
    parquet: bool = False,
    progress: Progress | None = None,
    options: ExportOptions | None = None,
) -> ExportStats:
    """Write ``out_dir`` as a Hugging Face dataset (a data file per split, ``README.md``, ``manifest.json``).

    The directory is replaced as a whole (:mod:`pipelines.export.layout`): a reader sees the earlier
    export or this one, never a mix, wherever the export is interrupted.

    Args:
        lake: the lakehouse.
        fmt: one of :data:`FORMATS`.
        out_dir: target directory (created); nothing is written outside it and its staging sibling.
        min_quality: threshold; ``options.min_quality`` by default.
        day: only sessions started on this UTC day (the nightly partition).
        clock: the export time (tests).
        force: export into a directory that holds other things too (they are kept; an earlier export's
            files are replaced whole). An earlier export alone is replaced without it.
        filters: policy version, task family, time range, split, complete groups, origins (``min_quality``
            and ``day`` above take precedence when given).
        parquet: write Parquet (``rl`` only: typed columns) instead of JSON lines.
        progress: told of each record written (the total is not known in advance).
        options: the export's configuration; read from the lakehouse's settings by default.

    Returns:
        :class:`ExportStats`; ``quarantined`` counts sessions left out (``quarantine`` table).

    Raises:
        ExportError: unknown format, a refused directory, a directory holding something else without
            ``force``, ``out_dir`` is a file, or a file could not be written.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    started = time.monotonic()
    options = options or ExportOptions.from_settings(lake.settings)
    filters = _export_filters(fmt, parquet, options, filters, min_quality, day)
    target = open_target(out_dir, lake.locations, force)
    root = target.root
    stats = ExportStats(export_id=uuid.uuid4().hex, format=fmt, out_dir=str(root))
    manifest_text, snapshots = _write_and_swap(lake, options, fmt, filters, target, stats, clock, parquet, progress)
    stats.manifest = str(root / "manifest.json")
    _record_export(lake, stats, filters, manifest_text, snapshots)
    stats.seconds = time.monotonic() - started
    return stats


def _export_filters(
    fmt: str,
    parquet: bool,
    options: ExportOptions,
    filters: ExportFilters | None,
    min_quality: float | None,
    day: date | None,
) -> ExportFilters:
    """The export's filters: the caller's, with ``min_quality`` and ``day`` over them, then the format's rules."""
    if parquet and fmt != "rl":
        raise ExportError(f"--parquet is for --format rl (typed columns); {fmt} is written as JSON lines")
    filters = filters or ExportFilters()
    if min_quality is not None or day is not None:
        filters = replace(
            filters, min_quality=filters.min_quality if min_quality is None else min_quality, day=day or filters.day
        )
    return filters.for_format(fmt, options.min_quality)


def _write_and_swap(
    lake: Lakehouse,
    options: ExportOptions,
    fmt: str,
    filters: ExportFilters,
    target: Target,
    stats: ExportStats,
    clock: Callable[[], datetime],
    parquet: bool,
    progress: Progress | None,
) -> tuple[str, dict[str, int | None]]:
    """Write the export into the target's staging directory and swap it in; on any failure, discard it."""
    try:
        try:
            manifest_text, snapshots = _write_export(
                lake, options, fmt, filters, target.staging_fd, stats, clock, parquet, progress
            )
            commit(target)
        except BaseException:
            discard(target)
            raise
    except OSError as exc:
        raise ExportError(f"cannot write the export into {target.root}: {exc.strerror or exc}") from exc
    finally:
        target.close()  # also releases the flock
    return manifest_text, snapshots


def _record_export(
    lake: Lakehouse, stats: ExportStats, filters: ExportFilters, manifest_text: str, snapshots: dict[str, int | None]
) -> None:
    """Append the export's row to the ``exports`` table (written once the directory is in place)."""
    day = filters.day
    row = {
        "export_id": stats.export_id,
        "created_at": datetime.fromisoformat(json.loads(manifest_text)["created_at"]),
        "format": stats.format,
        "out_dir": stats.out_dir,
        "partition": day.isoformat() if day else None,
        "min_quality": filters.min_quality,
        "sessions": stats.sessions,
        "records": stats.records,
        "scorer_version": json.loads(manifest_text)["scorer_version"],
        "files": json.dumps(stats.files, sort_keys=True),
        "manifest_sha256": hashlib.sha256(manifest_text.encode()).hexdigest(),
        "source_snapshots": json.dumps(snapshots, sort_keys=True),
    }
    lake.table(EXPORTS.name).append(pa.Table.from_pylist([row], schema=EXPORTS.arrow_schema()))


class _SplitFiles:
    """One data file per split, opened when the split's first record comes (an empty split has none)."""

    def __init__(self, dir_fd: int, folder: str, suffix: str, parquet: bool = False) -> None:
        self.dir_fd, self.folder, self.suffix, self.parquet = dir_fd, folder, suffix, parquet
        self.sub_fd: int | None = None
        self.files: dict[str, tuple[_ExclusiveFile, Any, _ParquetSink | None]] = {}
        self.records: dict[str, int] = {}

    def write(self, split: str, record: dict[str, Any], line: str) -> None:
        if split not in self.files:
            if self.sub_fd is None:
                self.sub_fd = open_subdirectory(self.dir_fd, self.folder)
            out = _ExclusiveFile(self.sub_fd, f"{split}.{self.suffix}", binary=self.parquet)
            digest = hashlib.sha256()
            self.files[split] = (out, digest, _ParquetSink(out, digest) if self.parquet else None)
            self.records[split] = 0
        out, digest, sink = self.files[split]
        if sink is not None:
            sink.add(record)
        else:
            out.handle.write(line)
            digest.update(line.encode("utf-8"))
        self.records[split] += 1

    def commit(self) -> dict[str, str]:
        """Close every file into place; split → sha256."""
        digests = {}
        for split, (out, digest, sink) in self.files.items():
            if sink is not None:
                sink.close()
            out.commit()
            digests[split] = digest.hexdigest()
        if self.sub_fd is not None:
            os.fsync(self.sub_fd)
        return digests

    def discard(self) -> None:
        for out, _, _ in self.files.values():
            out.discard()

    def close(self) -> None:
        if self.sub_fd is not None:
            os.close(self.sub_fd)


@dataclass
class _Tally:
    """What the export counted while writing its sessions (beyond :class:`ExportStats`)."""

    quarantined: list[Quarantined] = field(default_factory=list)
    splits: dict[str, int] = field(default_factory=dict)  # sessions per split
    origins: dict[str, int] = field(default_factory=dict)  # sessions per origin
    token_level: int = 0  # sessions whose records carry token ids
    segmented: int = 0  # sessions written as more than one record


def _write_export(
    lake: Lakehouse,
    options: ExportOptions,
    fmt: str,
    filters: ExportFilters,
    dir_fd: int,
    stats: ExportStats,
    clock: Callable[[], datetime],
    parquet: bool,
    progress: Progress | None = None,
) -> tuple[str, dict[str, int | None]]:
    """Write the split files, then the card and the manifest, into the staging directory; returns the manifest."""
    from pipelines.score import SCORED_VERSION, scoring_manifest  # the scoring stack only once exporting

    snapshots = _snapshot_ids(lake)
    scoring = scoring_manifest(lake)
    weights = _flag_weights(scoring)
    tally = _Tally()
    selection: dict[str, Any] = {}
    prices = lake.prices
    data = _SplitFiles(dir_fd, "data", "parquet" if parquet else "jsonl", parquet)
    # atif: what this lake concluded about each session, beside the trajectories (see pipelines.export.atif)
    scores = _SplitFiles(dir_fd, "scores", "jsonl") if fmt == "atif" else None
    sketches = {"default": FeatureSketch(), "scores": FeatureSketch()}
    try:
        chosen = _sessions(lake, filters, weights, report=selection, memory_limit=options.memory_limit)
        _write_sessions(chosen, fmt, prices, data, scores, sketches, stats, tally, progress)
        digests = data.commit()
        score_digests = scores.commit() if scores is not None else {}
    except BaseException:
        data.discard()
        if scores is not None:
            scores.discard()
        raise
    finally:
        data.close()
        if scores is not None:
            scores.close()
    checkpoint("data_written")
    stats.quarantined = len(tally.quarantined)
    stats.per_origin = tally.origins
    stats.considered = int(selection.get("considered", 0))
    stats.left_out = {**selection.get("left_out", {}), "quarantined": stats.quarantined}
    if tally.quarantined:
        record_quarantine(lake, tally.quarantined, run_id=stats.export_id)
    entries = _file_entries(data, digests, scores, score_digests)
    stats.files = {str(e["path"]): str(e["sha256"]) for e in entries}
    counts = _counts(stats, selection, tally)
    card_text = _write_card(dir_fd, fmt, entries, sketches, counts, parquet)
    checkpoint("card_written")
    manifest = {
        "export_id": stats.export_id,
        "created_at": clock().isoformat(),
        "format": fmt,
        "file_format": "parquet" if parquet else "jsonl",
        "files": entries,
        "card": {"path": "README.md", "sha256": hashlib.sha256(card_text.encode()).hexdigest()},
        "filters": filters.as_dict(),
        "splits": {"by": "task_family", "hash": "sha256", "percent": SPLIT_PERCENT},
        "counts": counts,
        # how costs were priced: recorded where the server reported one, else tokens × this table
        "prices": prices.as_json(),
        "scorer_version": lake.table(SCORES.name).properties.get(SCORED_VERSION, SCORER_VERSION),
        "scoring": scoring,
        "source_snapshots": snapshots,
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _write_file(dir_fd, "manifest.json", manifest_text)
    return manifest_text, snapshots


def _write_sessions(
    chosen: Iterable[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], _Blobs]],
    fmt: str,
    prices: PriceTable,
    data: _SplitFiles,
    scores: _SplitFiles | None,
    sketches: dict[str, FeatureSketch],
    stats: ExportStats,
    tally: _Tally,
    progress: Progress | None,
) -> None:
    """Build each chosen session's records and write them to its split (a session that cannot be: quarantined)."""
    for session, steps, calls, lookup in chosen:
        try:
            records, judgement = _records(fmt, session, steps, calls, lookup, prices)
            lines = [_record_line(record, sort_keys=fmt == "atif") for record in records]
            judged = _record_line(judgement, sort_keys=True) if judgement is not None else None
        except RecordError as exc:
            tally.quarantined.append(Quarantined(session["session_id"], "export", exc.reason, "skipped", str(exc)))
            continue
        split = str(session["split"])
        for record, line in zip(records, lines, strict=True):
            data.write(split, record, line)
            sketches["default"].add(record)
        if scores is not None and judged is not None and judgement is not None:
            scores.write(split, judgement, judged)
            sketches["scores"].add(judgement)
        stats.sessions += 1
        stats.records += len(records)
        tally.splits[split] = tally.splits.get(split, 0) + 1
        tally.origins[session["origin"]] = tally.origins.get(session["origin"], 0) + 1
        tally.token_level += bool(records[0].get("has_token_ids", fmt in TRAINER_FORMATS))
        tally.segmented += len(records) > 1
        if progress is not None:
            progress(stats.records, None, "records")


def _file_entries(
    data: _SplitFiles, digests: dict[str, str], scores: _SplitFiles | None, score_digests: dict[str, str]
) -> list[dict[str, Any]]:
    """The manifest's ``files``: each written data file (then each scores file), in split order."""
    order = [s for s in SPLIT_PERCENT if s in digests]
    entries: list[dict[str, Any]] = [
        {
            "path": f"data/{s}.{data.suffix}",
            "config": "default",
            "split": s,
            "sha256": digests[s],
            "records": data.records[s],
        }
        for s in order
    ]
    if scores is not None:
        entries += [
            {
                "path": f"scores/{s}.jsonl",
                "config": "scores",
                "split": s,
                "sha256": score_digests[s],
                "records": scores.records[s],
            }
            for s in order
            if s in score_digests
        ]
    return entries


def _counts(stats: ExportStats, selection: dict[str, Any], tally: _Tally) -> dict[str, Any]:
    """The manifest's (and the card's) ``counts``."""
    return {
        "considered": stats.considered,
        "considered_by_origin": selection.get("considered_by_origin", {}),
        "left_out": stats.left_out,
        "sessions": stats.sessions,
        "records": stats.records,
        "quarantined": stats.quarantined,
        "per_split": {s: tally.splits.get(s, 0) for s in SPLIT_PERCENT},
        "per_origin": tally.origins,
        "with_token_ids": tally.token_level,
        "segmented": tally.segmented,  # rl: sessions split into segments where a prompt rewrote history
    }


def _write_card(
    dir_fd: int,
    fmt: str,
    entries: list[dict[str, Any]],
    sketches: dict[str, FeatureSketch],
    counts: dict[str, Any],
    parquet: bool,
) -> str:
    """Write ``README.md`` (the dataset card: its configs, features and counts); returns its text."""
    configs: dict[str, dict[str, str]] = {}
    for e in entries:
        configs.setdefault(str(e["config"]), {})[str(e["split"])] = str(e["path"])
    card_text = card(fmt, configs, {k: v.features() for k, v in sketches.items()}, counts, parquet)
    _write_file(dir_fd, "README.md", card_text)
    return card_text


def _flag_weights(scoring: dict[str, object]) -> dict[str, float]:
    """Flag → the quality multiplier the governance table the scores were computed with gives it."""
    governance = scoring.get("governance")
    weights: dict[str, float] = {}
    for name, policy in governance.items() if isinstance(governance, dict) else []:
        weight = policy.get("weight") if isinstance(policy, dict) else None
        weights[str(name)] = float(weight) if isinstance(weight, int | float) else 1.0
    return weights


class _ParquetSink:
    """``rl`` records into a Parquet file in row groups of :data:`PARQUET_ROWS` (memory bounded by one group)."""

    def __init__(self, out: _ExclusiveFile, digest: Any) -> None:
        self.out, self.digest = out, digest
        self.rows: list[dict[str, Any]] = []
        self.writer = pq.ParquetWriter(_HashingFile(out.handle, digest), RL_SCHEMA, compression="zstd")

    def add(self, record: dict[str, Any]) -> None:
        # typed columns cannot hold each record's own tool schemas: JSON text, as OpenAI keeps arguments
        self.rows.append({**record, "tools": json.dumps(record.get("tools") or [], sort_keys=True)})
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
