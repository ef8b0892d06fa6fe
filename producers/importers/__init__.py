"""Importers of trajectories recorded by other agent frameworks into trajlake's event stream.

Each module converts one recorded run into the events a live sandbox host
emits (session_start, agent_input, agent_action, env_feedback, file_op,
evaluation, session_end) through ``SessionEmitter``:

- ``swe_agent``: SWE-agent ``.traj`` (v0.x, v1.x function calling, EnIGMA CTF);
- ``mini_swe_agent``: mini-swe-agent ``mini-swe-agent-1.x`` with a companion ``*.report.json``;
- ``openhands``: OpenHands event lists, and OpenHands evaluation output (``output.jsonl``,
  one session per line).

Ids derive from the file's sha256, so importing the same file twice gives the
same events (and ingest keeps them once). Example::

    events = import_trajectory("run.traj.json")
    with EventProducer.from_settings(host_id="importer") as producer:
        import_paths(["run.traj.json"], producer.emit)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from producers.importers import atif, mini_swe_agent, openhands, swe_agent
from producers.importers._common import ImportFormatError, read_source
from producers.redact import redact_event
from producers.sdk import Event

# Detection order matters only for ambiguous input; the three shapes are disjoint.
FORMATS: dict[str, ModuleType] = {
    mini_swe_agent.FRAMEWORK: mini_swe_agent,
    swe_agent.FRAMEWORK: swe_agent,
    openhands.FRAMEWORK: openhands,
    atif.FRAMEWORK: atif,
}


@dataclass(frozen=True)
class ImportSummary:
    """What importing one file produced."""

    path: Path
    framework: str
    session_id: str
    events: int
    steps: int


def _detect(path: Path, data: Any) -> str:
    for name, module in FORMATS.items():
        if module.looks_like(data):
            return name
    shape = type(data).__name__ + (f" with keys {sorted(data)[:8]}" if isinstance(data, dict) else "")
    raise ImportFormatError(path, f"unknown trajectory format (JSON {shape}); expected one of {sorted(FORMATS)}")


def detect_format(path: Path | str) -> str:
    """The framework that recorded ``path``: ``swe-agent``, ``mini-swe-agent`` or ``openhands``.

    Raises:
        ImportFormatError: unreadable, not JSON, or no known format.
    """
    source = read_source(path)
    return _detect(source.path, source.data)


def import_trajectory(path: Path | str, format: str = "auto", redact: bool = True) -> list[Event]:
    """All events of the run recorded in ``path``, in emission order (``seq`` from 0).

    Args:
        path: the recorded run.
        format: ``auto`` (detect) or a framework name from ``FORMATS``.
        redact: redact secrets in every event (``producers.redact``, as the producer does before
            sending); off only to measure redaction itself.

    Raises:
        ImportFormatError: unknown format name, unreadable/corrupt file, or content that does not fit the format.
    """
    source = read_source(path)
    if format == "auto":
        format = _detect(source.path, source.data)
    module = FORMATS.get(format)
    if module is None:
        raise ImportFormatError(source.path, f"unknown format {format!r}; expected auto or one of {sorted(FORMATS)}")
    try:
        events = module.convert(source)
    except ImportFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # Shape surprises deep in a file are corrupt input, reported with the file instead of a traceback.
        raise ImportFormatError(source.path, f"does not fit the {format} format: {type(exc).__name__}: {exc}") from exc
    return [redact_event(event) for event in events] if redact else events


def import_paths(
    paths: Iterable[Path | str], sink: Callable[[Event], Any], format: str = "auto"
) -> list[ImportSummary]:
    """Convert every file first, then hand all events to ``sink`` (e.g. ``EventProducer.emit``).

    Converting before sending means one corrupt file stops the import before any event leaves.
    Returns one summary per imported session (a JSON Lines file may hold several).

    Raises:
        ImportFormatError: any file cannot be imported (nothing is sent then).
    """
    converted: list[tuple[Path, str, list[Event]]] = []
    for path in paths:
        path = Path(path)
        events = import_trajectory(path, format)
        framework = events[0]["image_name"].removeprefix("imported/") if events else format
        converted.append((path, framework, events))
    summaries = []
    for path, framework, events in converted:
        sessions: dict[str, list[Event]] = {}
        for event in events:
            sink(event)
            sessions.setdefault(event["session_id"], []).append(event)
        for session_id, own in sessions.items():  # one file may hold many sessions (JSON Lines)
            summaries.append(
                ImportSummary(
                    path,
                    framework,
                    session_id,
                    len(own),
                    sum(1 for e in own if e["event_type"] == "agent_action"),
                )
            )
    return summaries


__all__ = ["FORMATS", "ImportFormatError", "ImportSummary", "detect_format", "import_paths", "import_trajectory"]
