"""Importing paths: which format a file or directory holds, its sessions, and what was set aside.

``iter_import`` walks a path (a file, a multi-run file record by record, a Harbor job, an OpenHands V1
conversation directory) and yields each session converted by its format's module (``FORMATS``), or what
was quarantined or skipped; ``import_paths`` delivers them to a sender with the verdicts found beside
the runs and reports per file. The package ``producers.importers`` hands these names on.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from common.progress import Progress
from producers.importers import atif, harbor, mini_swe_agent, openhands, openhands_v1, otel, swe_agent
from producers.importers._builder import REDACT, ImportedSession
from producers.importers._source import (
    ImportFormatError,
    JsonLines,
    SourceFile,
    read_bytes,
    read_json_file,
    read_source,
)
from producers.importers.verdicts import HARBOR, VerdictFile, parse_verdicts, read_verdicts, with_verdicts
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
    empty: list[tuple[str, str]] = field(default_factory=list)  # (path, why it gave no session)


def _shape(data: Any) -> str:
    """What parsed JSON looks like, in a few words (its type, keys or length)."""
    if isinstance(data, JsonLines):
        return "JSON Lines of " + _shape(data.first)
    shape = type(data).__name__ + (f" with keys {sorted(map(str, data))[:8]}" if isinstance(data, dict) else "")
    if isinstance(data, list):
        shape += f" of {len(data)} items"
    return shape


def _detect(source: SourceFile) -> str:
    for name, module in FORMATS.items():
        if module.looks_like(source.data):
            return name
    data = source.data.first if isinstance(source.data, JsonLines) else source.data
    single = _is_single_event(data)
    if single is not None and not isinstance(source.data, JsonLines):
        raise ImportFormatError(
            source.path,
            f"unknown trajectory format: one {single} event of a conversation saved one event per file; "
            f"import its directory ({source.path.parent})",
        )
    reasons = "; ".join(f"{name}: {module.why_not(data)}" for name, module in FORMATS.items())
    raise ImportFormatError(source.path, f"unknown trajectory format: detected {_shape(source.data)}; {reasons}")


def _looks(source: SourceFile) -> str:
    """What a file is, for a forced ``--format`` that does not fit: the format detected, else its shape."""
    if parse_verdicts(source.path, source.data) is not None:
        return "a verdict report (give it to --verdicts)"
    single = _is_single_event(source.data)
    if single is not None:
        return f"one {single} event of a conversation saved one event per file (import its directory)"
    try:
        return f"{_detect(source)} (import it with --format auto)"
    except ImportFormatError:
        return _shape(source.data)


def _is_single_event(value: Any) -> str | None:
    """Which OpenHands generation one persisted event object is (``openhands-v1``, ``openhands``), or None."""
    if not isinstance(value, dict) or "id" not in value:
        return None
    if isinstance(value.get("kind"), str) and "source" in value:
        return openhands_v1.FRAMEWORK
    if isinstance(value.get("action"), str) or isinstance(value.get("observation"), str):
        return openhands.FRAMEWORK
    return None


def _file_order(path: Path) -> tuple[int, str]:
    """Event files in the order they were written: by the first number in the name (``event-00012-…``, ``12.json``)."""
    digits = re.search(r"\d+", path.name)
    return (int(digits.group()) if digits else -1, path.name)


@dataclass(frozen=True)
class EventDirectory:
    """A conversation persisted one event per file (OpenHands SDK and CLI, OpenHands V0 sessions)."""

    path: Path  # the conversation (named by its directory)
    framework: str
    files: list[Path]
    state: Path | None  # base_state.json when the SDK saved one


def event_directory(path: Path) -> EventDirectory | None:
    """``path`` as a conversation of one-event files, recognised by what the files hold, not by their names.

    The SDK writes ``<conversation>/events/event-*.json`` beside ``base_state.json``; the CLI's saved
    conversations are the bare event files; OpenHands V0 wrote ``sessions/<id>/events/<n>.json``.
    """
    for events, owner in ((path / "events", path), (path, path.parent if path.name == "events" else path)):
        if not events.is_dir():
            continue
        try:
            files = sorted(
                (f for f in events.iterdir() if f.suffix == ".json" and f.name not in _SIDE_FILES and f.is_file()),
                key=_file_order,
            )
        except OSError:
            continue
        if not files:
            continue
        try:
            framework = _is_single_event(read_json_file(files[0]))
        except ImportFormatError:
            continue
        if framework is None:
            continue
        state = owner / "base_state.json"
        return EventDirectory(owner, framework, files, state if state.is_file() else None)
    return None


def _convert_event_directory(found: EventDirectory) -> list[ImportedSession]:
    if found.framework == openhands_v1.FRAMEWORK:
        state = read_json_file(found.state) if found.state is not None else {}
        return openhands_v1.convert_event_files(
            found.path, found.files, state if isinstance(state, dict) else {}, found.path.name
        )
    events = [read_json_file(f) for f in found.files]
    digest = hashlib.sha256(b"".join(read_bytes(f) for f in found.files)).hexdigest()
    source = SourceFile(found.path / found.path.name, digest, [e for e in events if isinstance(e, dict)])
    return openhands.convert(source)


def detect_format(path: Path | str) -> str:
    """The framework that recorded ``path`` (a file, or a Harbor / OpenHands conversation directory).

    Raises:
        ImportFormatError: unreadable, not JSON, or no known format (the message says what was found and why).
    """
    path = Path(path)
    if path.is_dir():
        if harbor.is_trial_dir(path) or harbor.is_job_dir(path):
            return harbor.FRAMEWORK
        found = event_directory(path)
        if found is not None:
            return found.framework
        raise ImportFormatError(path, "a directory that is no Harbor trial or job, nor an OpenHands conversation")
    if harbor.trial_of(path) is not None:
        return harbor.FRAMEWORK
    return _detect(read_source(path))


def _records(source: SourceFile, module: ModuleType) -> Iterator[SourceFile | ImportFormatError]:
    """The records of a source the format converts one at a time (lines of JSON Lines), or the source itself.

    The source itself is handed over, not kept: once converted, the parsed file goes before its sessions leave.
    """
    if isinstance(source.data, JsonLines):
        if module is openhands_v1 and not openhands_v1._is_v1_output(source.data.first):
            return _handed_over([source])  # one conversation's events, one per line
        if module is otel:
            return _handed_over([source])
        return source.data.records()
    return _handed_over([source])


def _handed_over(items: list[SourceFile]) -> Iterator[SourceFile]:
    """The items of ``items``, each removed as it is handed on (the iterator keeps none of them)."""
    while items:
        yield items.pop(0)


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


@dataclass(frozen=True)
class Skipped:
    """A file of a directory that is no recorded run (and why)."""

    path: str
    reason: str

    def __str__(self) -> str:
        return self.path


#: What importing a path yields, one item at a time: a session, a quarantined record, a skipped file.
Item = ImportedSession | Quarantined | Skipped


def _iter_source(source: SourceFile, format: str) -> Iterator[Item]:
    """The sessions of one file, one record at a time (a JSON Lines file is never held whole)."""
    name = _detect(source) if format == "auto" else format
    module = FORMATS.get(name)
    if module is None:
        raise ImportFormatError(source.path, f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    if format != "auto" and not module.looks_like(source.data):
        raise ImportFormatError(
            source.path,
            f"--format {format} does not fit: {module.why_not(_first(source.data))}; the file looks like "
            + _looks(source),
        )
    lines = isinstance(source.data, JsonLines)
    sessions = 0
    first_problem: Quarantined | None = None
    path, records = source.path, _records(source, module)
    del source  # a converted record is let go before its sessions leave (a large run: its texts are parts now)
    for record in records:
        if isinstance(record, ImportFormatError):
            problem = Quarantined(record.path, record.position, record.reason)
            first_problem = first_problem or problem
            yield problem
            continue
        position = record.position
        try:
            converted = _convert_record(module, record)
        except ImportFormatError as exc:
            if not lines:
                raise
            problem = Quarantined(exc.path, position, exc.reason)
            first_problem = first_problem or problem
            yield problem
            continue
        finally:
            del record
        while converted:
            sessions += 1
            yield converted.pop(0)
    if lines and not sessions and first_problem is not None:
        raise ImportFormatError(path, f"no record could be imported ({first_problem.position}: {first_problem.reason})")


def _first(data: Any) -> Any:
    return data.first if isinstance(data, JsonLines) else data


def _iter_file(path: Path, format: str) -> Iterator[Item]:
    trial = harbor.trial_of(path) if format in ("auto", harbor.FRAMEWORK, atif.FRAMEWORK) else None
    if trial is not None:  # a Harbor trial's trajectory given alone: its verdict is in ../result.json
        yield from harbor.convert_trial(trial, only=path)
        return
    yield from _iter_source(read_source(path), atif.FRAMEWORK if format == harbor.FRAMEWORK else format)


def _iter_directory(path: Path, format: str) -> Iterator[Item]:
    """A Harbor trial or job (a trial at a time), an OpenHands conversation, or a tree of recorded runs."""
    if format in ("auto", harbor.FRAMEWORK) and (harbor.is_trial_dir(path) or harbor.is_job_dir(path)):
        for trial in [path] if harbor.is_trial_dir(path) else harbor.trial_dirs(path):
            try:
                yield from harbor.convert_trial(trial)
            except ImportFormatError as exc:
                yield Quarantined(str(trial), trial.name, exc.reason)
        return
    found = event_directory(path) if format in ("auto", openhands.FRAMEWORK, openhands_v1.FRAMEWORK) else None
    if found is not None:
        yield from _convert_event_directory(found)
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        here = Path(root)
        if here != path and (harbor.is_trial_dir(here) or event_directory(here) is not None):
            dirs[:] = []  # a trial or a conversation inside the tree: imported whole, once
            try:
                yield from _iter_directory(here, format)
            except ImportFormatError as exc:
                yield Quarantined(str(here), "", exc.reason)
            continue
        for name in sorted(files):
            if not name.endswith(_RUN_SUFFIXES) or name in _SIDE_FILES:
                continue
            child = here / name
            try:
                source = read_source(child)
                if format == "auto" and parse_verdicts(child, source.data) is not None:
                    continue  # a report: read beside the runs it judges
                sessions = _iter_source(source, format)
                del source  # held by the conversion only, which lets it go once converted
                yield from sessions
            except ImportFormatError as exc:
                if "unknown trajectory format" in exc.reason or "does not fit" in exc.reason:
                    yield Skipped(str(child), exc.reason)
                else:
                    yield Quarantined(str(child), "", exc.reason)


def iter_import(path: Path | str, format: str = "auto") -> Iterator[Item]:
    """Every session of one path, yielded as soon as it is converted (memory: one run, not the whole job).

    Raises:
        ImportFormatError: the path cannot be read, its format is unknown, or (a single run) it does not fit.
    """
    path = Path(path)
    if format not in FORMAT_NAMES:
        raise ImportFormatError(path, f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    if path.is_dir():
        yield from _iter_directory(path, format)
    else:
        yield from _iter_file(path, format)


def import_file(path: Path | str, format: str = "auto") -> FileImport:
    """Every session of one recorded run, multi-run file or run directory, with what had to be quarantined.

    Raises:
        ImportFormatError: the path cannot be read, its format is unknown, or (a single run) it does not fit.
    """
    path = Path(path)
    result = FileImport(path, "mixed")
    for item in iter_import(path, format):
        if isinstance(item, Quarantined):
            result.quarantined.append(item)
        elif isinstance(item, Skipped):
            result.skipped.append(item.path)
        else:
            result.sessions.append(item)
    frameworks = {s.framework for s in result.sessions}
    if len(frameworks) == 1:
        result.framework = frameworks.pop()
    return result


def import_trajectory(path: Path | str, format: str = "auto", redact: bool = True) -> list[Event]:
    """All events of the run(s) recorded in ``path``, session after session, each in emission order (``seq`` from 0).

    Args:
        path: the recorded run (a file, or a Harbor / OpenHands conversation directory).
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


def _nothing_from(path: Path, quarantined: list[Quarantined], skipped: list[Skipped]) -> str:
    """Why a path gave no session, in one line."""
    if quarantined:
        more = f" (and {len(quarantined) - 1} more)" if len(quarantined) > 1 else ""
        first = quarantined[0]
        if first.path == str(path):  # the path itself: its reason, without naming it again
            return (f"{first.position}: " if first.position else "") + first.reason + more
        return f"{first}{more}"
    if skipped:
        more = f"; {len(skipped) - 1} more files skipped" if len(skipped) > 1 else ""
        return f"no recorded run in it: {skipped[0].path}: {skipped[0].reason}{more}"
    if path.is_dir():
        return f"no recorded run in it (no {'/'.join(_RUN_SUFFIXES)} files but reports and configs)"
    return "no session in it"


def import_paths(
    paths: Iterable[Path | str],
    sink: Callable[[Event], Any] | None = None,
    format: str = "auto",
    *,
    send: Callable[[ImportedSession], Any] | None = None,
    progress: Progress | None = None,
) -> ImportReport:
    """Import every path; each session goes to ``send`` (or event by event to ``sink``) whole, as soon as it is read.

    A session is converted completely before it leaves, so it is never sent in part; sessions leave
    one at a time (a job's trials, a JSON Lines file's lines), so memory is bounded by the largest
    single run. A record that cannot be imported is quarantined (named in the report) and the others
    go on; a path that gives no session at all is named in :attr:`ImportReport.empty` with the reason.

    Args:
        paths: files or directories.
        sink: receives every event (e.g. ``EventProducer.emit``), session after session.
        format: ``auto`` or a name from ``FORMAT_NAMES``.
        send: receives each whole session instead (the CLI encodes all of a session's events before
            producing any, so an encoding failure sends nothing of it).
        progress: told of each path done (imported or quarantined).

    Raises:
        ImportFormatError: an unknown format name (nothing is sent).
    """
    if format not in FORMAT_NAMES:
        raise ImportFormatError("--format", f"unknown format {format!r}; expected one of {list(FORMAT_NAMES)}")
    report = ImportReport()
    todo = [Path(path) for path in paths]
    for done, path in enumerate(todo, 1):
        if progress is not None and done > 1:
            progress(done - 1, len(todo), "files")
        sessions = 0
        quarantined: list[Quarantined] = []
        skipped: list[Skipped] = []
        reports = _reports_in(path)
        try:
            for item in iter_import(path, format):
                if isinstance(item, Quarantined):
                    quarantined.append(item)
                    continue
                if isinstance(item, Skipped):
                    skipped.append(item)
                    continue
                sessions += 1
                if reports:
                    with_verdicts(item, reports, beside=True)
                _deliver(item, path, report, sink, send)
        except ImportFormatError as exc:
            quarantined.append(Quarantined(exc.path, exc.position, exc.reason))
        report.quarantined += quarantined
        report.skipped += [s.path for s in skipped]
        if not sessions:
            report.empty.append((str(path), _nothing_from(path, quarantined, skipped)))
    if progress is not None and todo:
        progress(len(todo), len(todo), "files")
    return report


def _reports_in(path: Path) -> list[VerdictFile]:
    """The harness reports anywhere in a directory given to import (a harness log tree beside the runs).

    They judge the sessions of the directory that brought no verdict of their own, by exact instance id.
    """
    if not path.is_dir():
        return []
    try:
        found = read_verdicts(path)[0]
    except ImportFormatError:
        return []
    merged = VerdictFile(str(path))  # one index, so each session is one lookup whatever the number of reports
    for report in found:
        for instance, verdict in report.verdicts.items():
            if verdict.provenance != HARBOR:  # a Harbor trial's result judges its own trial, read with it
                merged.verdicts.setdefault(instance, verdict)
    return [merged] if merged.verdicts else []


def _deliver(
    session: ImportedSession,
    path: Path,
    report: ImportReport,
    sink: Callable[[Event], Any] | None,
    send: Callable[[ImportedSession], Any] | None,
) -> None:
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
