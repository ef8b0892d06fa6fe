"""Importers of runs recorded by other agent frameworks into trajlake's event stream.

Each format module converts one recorded run (or one record of a multi-run file) into the
events a live sandbox host emits (session_start, agent_input, agent_action, env_feedback,
file_op, session_end, evaluation), through ``RunBuilder``; the format is detected from the content:

- ``mini-swe-agent``: 1.x text actions (``mini-swe-agent-1``) and 2.x tool calls (``mini-swe-agent-1.1``);
- ``swe-agent``: SWE-agent ``.traj`` (v0.x, v1.x function calling, EnIGMA CTF);
- ``openhands``: OpenHands V0 event lists and evaluation output (``output.jsonl``, one session per line);
- ``openhands-v1``: OpenHands V1 (software-agent-sdk) event streams and conversation directories;
- ``atif``: Harbor's ATIF v1.0-v1.8 trajectories; ``harbor``: Harbor trial and job directories
  (ATIF plus the verifier's ``result.json``);
- ``otel``: OpenTelemetry GenAI traces in OTLP JSON (one session per conversation or trace).

Ids derive from the record's sha256, so importing the same file twice gives the same events
(ingest and assembly keep them once), and an import never takes a session id another producer
owns. A file that is half good imports its good sessions; each bad record is quarantined with its
position (``line 7``, a trial's name). Example::

    report = import_paths(["run.traj.json"], send=producer_session_sender)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from producers.importers import atif, harbor, mini_swe_agent, openhands, openhands_v1, otel, swe_agent
from producers.importers._builder import REDACT, ImportedSession
from producers.importers._source import ImportFormatError, JsonLines, SourceFile, read_source
from producers.importers.verdicts import parse_verdicts
from producers.sdk import Event

# Detection order matters only for ambiguous input; the shapes are disjoint.
FORMATS: dict[str, ModuleType] = {
    mini_swe_agent.FRAMEWORK: mini_swe_agent,
    swe_agent.FRAMEWORK: swe_agent,
    openhands_v1.FRAMEWORK: openhands_v1,
    openhands.FRAMEWORK: openhands,
    atif.FRAMEWORK: atif,
    otel.FRAMEWORK: otel,
}
#: Every value ``format`` may take (``harbor`` is a directory layout around ATIF).
FORMAT_NAMES = ("auto", *FORMATS, harbor.FRAMEWORK)
# Names of files in a run directory that are not runs (verdicts, configs, predictions): skipped in a walk.
_SIDE_FILES = frozenset({"preds.json", "config.json", "manifest.json", "base_state.json", "args.yaml", "metadata.json"})
_RUN_SUFFIXES = (".json", ".jsonl", ".traj")


@dataclass(frozen=True)
class Quarantined:
    """A record that could not be imported: where it is and why (one line)."""

    path: str
    position: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.path} ({self.position})" if self.position else self.path
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class ImportSummary:
    """What importing one session produced."""

    path: Path
    framework: str
    session_id: str
    events: int
    steps: int
    position: str = ""
    set_aside: str = ""  # fields that had to be set aside (out of range, unpaired surrogates, …)


@dataclass
class FileImport:
    """Everything one path gave: its sessions and its quarantined records."""

    path: Path
    framework: str
    sessions: list[ImportedSession] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files of a directory that are no recorded run


@dataclass
class ImportReport:
    """What ``import_paths`` did: one summary per session sent, one entry per quarantined record."""

    summaries: list[ImportSummary] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _detect(source: SourceFile) -> str:
    for name, module in FORMATS.items():
        if module.looks_like(source.data):
            return name
    data = source.data.first if isinstance(source.data, JsonLines) else source.data
    lines = "JSON Lines of " if isinstance(source.data, JsonLines) else ""
    shape = type(data).__name__ + (f" with keys {sorted(map(str, data))[:8]}" if isinstance(data, dict) else "")
    if isinstance(data, list):
        shape += f" of {len(data)} items"
    reasons = "; ".join(f"{name}: {module.why_not(data)}" for name, module in FORMATS.items())
    raise ImportFormatError(source.path, f"unknown trajectory format: detected {lines}{shape}; {reasons}")


def detect_format(path: Path | str) -> str:
    """The framework that recorded ``path`` (a file, or a Harbor / OpenHands V1 directory).

    Raises:
        ImportFormatError: unreadable, not JSON, or no known format (the message says what was found and why).
    """
    path = Path(path)
    if path.is_dir():
        if harbor.is_trial_dir(path) or harbor.is_job_dir(path):
            return harbor.FRAMEWORK
        if openhands_v1.is_conversation_dir(path):
            return openhands_v1.FRAMEWORK
        raise ImportFormatError(path, "a directory that is no Harbor trial or job, nor an OpenHands V1 conversation")
    return _detect(read_source(path))


def _records(source: SourceFile, module: ModuleType) -> Iterator[SourceFile | ImportFormatError]:
    """The records of a source the format converts one at a time (lines of JSON Lines), or the source itself."""
    if isinstance(source.data, JsonLines):
        if module is openhands_v1 and not openhands_v1._is_v1_output(source.data.first):
            yield source  # one conversation's events, one per line
            return
        if module is otel:
            yield source
            return
        yield from source.data.records()
    else:
        yield source


def _convert_record(module: ModuleType, record: SourceFile) -> list[ImportedSession]:
    if isinstance(record.data, JsonLines):
        if module is otel:
            return _convert_otel_lines(record)
        return openhands_v1.convert_stream(record)
    try:
        sessions: list[ImportedSession] = module.convert(record)
    except ImportFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        # Shape surprises deep in a record are corrupt input, reported with its place instead of a traceback.
        where = f"{record.position}: " if record.position else ""
        detail = f"{type(exc).__name__}: {exc}"
        raise ImportFormatError(record.path, f"{where}does not fit the {module.FRAMEWORK} format: {detail}") from exc
    return sessions


def _convert_otel_lines(source: SourceFile) -> list[ImportedSession]:
    """An OTLP JSON Lines file: the spans of every line, grouped into conversations across lines."""
    issues = otel.FieldIssues()
    spans: list[otel.Span] = []
    assert isinstance(source.data, JsonLines)
    for record in source.data.records():
        if isinstance(record, ImportFormatError):
            issues.add(record.position, "line is not valid JSON")
            continue
        spans.extend(otel.spans_from_json(record.data, issues))
    return otel.convert_groups(source, otel.group_sessions(spans), issues)


def _import_source(source: SourceFile, format: str) -> FileImport:
    name = _detect(source) if format == "auto" else format
    module = FORMATS.get(name)
    if module is None:
        raise ImportFormatError(source.path, f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    result = FileImport(source.path, name)
    for record in _records(source, module):
        if isinstance(record, ImportFormatError):
            result.quarantined.append(Quarantined(record.path, record.position, record.reason))
            continue
        try:
            result.sessions += _convert_record(module, record)
        except ImportFormatError as exc:
            if not isinstance(source.data, JsonLines):
                raise
            result.quarantined.append(Quarantined(exc.path, record.position, exc.reason))
    if isinstance(source.data, JsonLines) and not result.sessions and result.quarantined:
        first = result.quarantined[0]
        raise ImportFormatError(source.path, f"no record could be imported ({first.position}: {first.reason})")
    return result


def _walk(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(_RUN_SUFFIXES) and name not in _SIDE_FILES:
                yield Path(root) / name


def _import_directory(path: Path, format: str) -> FileImport:
    """A Harbor trial or job, an OpenHands V1 conversation, or a directory of recorded runs."""
    if format in ("auto", harbor.FRAMEWORK) and (harbor.is_trial_dir(path) or harbor.is_job_dir(path)):
        result = FileImport(path, harbor.FRAMEWORK)
        trials = [path] if harbor.is_trial_dir(path) else harbor.trial_dirs(path)
        for trial in trials:
            try:
                result.sessions += harbor.convert_trial(trial)
            except ImportFormatError as exc:
                result.quarantined.append(Quarantined(str(trial), trial.name, exc.reason))
        return result
    if format in ("auto", openhands_v1.FRAMEWORK) and openhands_v1.is_conversation_dir(path):
        return FileImport(path, openhands_v1.FRAMEWORK, openhands_v1.convert_directory(path))
    result = FileImport(path, "mixed")
    for child in _walk(path):
        try:
            source = read_source(child)
            if format == "auto" and parse_verdicts(child, source.data) is not None:
                continue  # a report: read beside the runs it judges
            part = _import_source(source, format)
        except ImportFormatError as exc:
            if "unknown trajectory format" in exc.reason:
                result.skipped.append(str(child))
            else:
                result.quarantined.append(Quarantined(str(child), "", exc.reason))
            continue
        result.sessions += part.sessions
        result.quarantined += part.quarantined
    return result


def import_file(path: Path | str, format: str = "auto") -> FileImport:
    """Every session of one recorded run, multi-run file or run directory, with what had to be quarantined.

    Raises:
        ImportFormatError: the path cannot be read, its format is unknown, or (a single run) it does not fit.
    """
    path = Path(path)
    if format not in FORMAT_NAMES:
        raise ImportFormatError(path, f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    if path.is_dir():
        return _import_directory(path, format)
    if format == harbor.FRAMEWORK:
        format = atif.FRAMEWORK
    return _import_source(read_source(path), format)


def import_trajectory(path: Path | str, format: str = "auto", redact: bool = True) -> list[Event]:
    """All events of the run(s) recorded in ``path``, session after session, each in emission order (``seq`` from 0).

    Args:
        path: the recorded run (a file, or a Harbor / OpenHands V1 directory).
        format: ``auto`` (detect) or a name from ``FORMAT_NAMES``.
        redact: redact secrets in every event (``producers.redact``, as the producer does before
            sending); off only to measure redaction itself.

    Raises:
        ImportFormatError: unknown format name, unreadable/corrupt file, or content that does not fit the format.
    """
    token = REDACT.set(redact)
    try:
        result = import_file(path, format)
    finally:
        REDACT.reset(token)
    return [event for session in result.sessions for event in session.events]


def import_paths(
    paths: Iterable[Path | str],
    sink: Callable[[Event], Any] | None = None,
    format: str = "auto",
    *,
    send: Callable[[ImportedSession], Any] | None = None,
) -> ImportReport:
    """Import every path, one file at a time; each session goes to ``send`` (or event by event to ``sink``) whole.

    A file is converted completely before any of its sessions leaves, so a session is never sent
    in part; a record that cannot be imported is quarantined (named in the report) and the others go on.

    Args:
        paths: files or directories.
        sink: receives every event (e.g. ``EventProducer.emit``), session after session.
        format: ``auto`` or a name from ``FORMAT_NAMES``.
        send: receives each whole session instead (the CLI encodes all of a session's events before
            producing any, so an encoding failure sends nothing of it).

    Raises:
        ImportFormatError: an unknown format name (nothing is sent).
    """
    if format not in FORMAT_NAMES:
        raise ImportFormatError("--format", f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    report = ImportReport()
    for path in paths:
        path = Path(path)
        try:
            result = import_file(path, format)
        except ImportFormatError as exc:
            report.quarantined.append(Quarantined(exc.path, "", exc.reason))
            continue
        report.quarantined += result.quarantined
        report.skipped += result.skipped
        for session in result.sessions:
            if send is not None:
                send(session)
            elif sink is not None:
                for event in session.events:
                    sink(event)
            report.summaries.append(
                ImportSummary(
                    path,
                    session.framework,
                    session.session_id,
                    len(session.events),
                    session.steps,
                    session.position,
                    session.issues.summary() if session.issues else "",
                )
            )
    return report


__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "FileImport",
    "ImportFormatError",
    "ImportReport",
    "ImportSummary",
    "ImportedSession",
    "Quarantined",
    "detect_format",
    "import_file",
    "import_paths",
    "import_trajectory",
]
