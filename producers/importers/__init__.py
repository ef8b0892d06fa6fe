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

from producers.importers.paths import (
    FORMAT_NAMES,
    FORMATS,
    FileImport,
    ImportedSession,
    ImportFormatError,
    ImportReport,
    ImportSummary,
    Item,
    Quarantined,
    Skipped,
    detect_format,
    event_directory,
    import_file,
    import_paths,
    import_trajectory,
    iter_import,
)

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "FileImport",
    "ImportFormatError",
    "ImportReport",
    "ImportSummary",
    "ImportedSession",
    "Item",
    "Skipped",
    "event_directory",
    "iter_import",
    "Quarantined",
    "detect_format",
    "import_file",
    "import_paths",
    "import_trajectory",
]
