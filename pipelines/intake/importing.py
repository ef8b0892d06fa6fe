"""``trajlake import``: recorded runs, verdicts and live OTLP traces into the event stream, a session at a time.

Each session is encoded whole before any of its events is produced (:class:`SessionSender`), so an
event that cannot be encoded sends nothing of its session, never a part. What could not be
imported (a corrupt line, a trial without a trajectory, a session that would not encode, a verdict
on an instance no session has) is listed in the result and written to the ``quarantine`` table
(``stage = 'import'``) with its file and position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.errors import ConfigError, TrajlakeError
from common.progress import Progress
from common.settings import Settings
from pipelines.intake.admission import Door, admit_session, check_sizes, door_key
from pipelines.intake.quarantine import Quarantined, record_quarantine
from pipelines.intake.verdicts import Attached, attach_verdicts, run_id
from producers.importers import ImportedSession, ImportReport, import_paths
from producers.importers.verdicts import VerdictFile, instance_alias, read_verdicts, with_verdicts
from producers.sdk import EventProducer
from warehouse.lakehouse import Lakehouse


def import_door(session: ImportedSession) -> Door:
    """The door of ``trajlake import``: the session's format is its origin."""
    return Door("import", format=session.framework)


def otlp_door(session: ImportedSession) -> Door:
    """The OTLP receiver's door: the client the receiver authenticated (stamped on every event it converted)."""
    first = session.events[0] if session.events else {}
    return Door("otlp", client=str((first.get("extra") or {}).get("otlp_client") or "anonymous"))


@dataclass
class SessionSender:
    """Sends sessions whole through the admission gate: admitted, every event encoded, then all produced.

    Args:
        producer: the Kafka producer (its redaction is off: the importers redact before splitting texts, and
            the gate checks again, ``pipelines.intake.admission``).
        door: the door a session came through (:func:`import_door`, :func:`otlp_door`).
        max_event_bytes: the largest encoded event a session may have (``TRAJLAKE_MAX_EVENT_BYTES``).
    """

    producer: EventProducer
    door: Callable[[ImportedSession], Door] = import_door
    max_event_bytes: int = 1 << 20
    failed: list[tuple[ImportedSession, str]] = field(default_factory=list)
    sent: set[str] = field(default_factory=set)
    #: What the gate recorded (flags and refusals), for the quarantine table.
    records: list[Quarantined] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)
    #: The installation's door key: every event admitted is signed with it (None: unsigned).
    key: str | None = field(default=None, repr=False)

    def __call__(self, session: ImportedSession) -> None:
        door = self.door(session)
        if self.key is not None and door.key is None:
            door = replace(door, key=self.key)
        admitted = admit_session(session.events, door)
        self.records += admitted.records
        if admitted.refused is not None:
            self._refuse(session, admitted.records[-1])
            return
        session.events = admitted.events
        try:
            encoded = [(event, self.producer.encode(event)) for event in session.events]
        except TrajlakeError as exc:
            self.failed.append((session, " ".join(str(exc).split())))
            return
        too_large = check_sizes(session.session_id, [value for _, value in encoded], self.max_event_bytes)
        if too_large is not None:
            self.records.append(too_large)
            self._refuse(session, too_large)
            return
        for event, value in encoded:
            self.producer.send(event["session_id"], event["event_id"], value)
        self.sent.add(session.session_id)

    def _refuse(self, session: ImportedSession, record: Quarantined) -> None:
        self.refused.add(session.session_id)
        self.failed.append((session, f"refused at admission ({record.reason}): {record.detail}"))


@dataclass
class ImportRun:
    """What one ``trajlake import`` did."""

    report: ImportReport = field(default_factory=ImportReport)
    attached: Attached | None = None
    failed: list[tuple[str, str]] = field(default_factory=list)  # (session id, why it could not be sent)
    #: With runs and ``--verdicts``: every instance the verdict files judge, and those no imported session has.
    verdict_instances: list[str] = field(default_factory=list)
    unmatched_verdicts: list[str] = field(default_factory=list)
    #: What the admission gate recorded (origins it restamped, sessions it refused), and those sessions' ids.
    admission: list[Quarantined] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)

    def quarantine_records(self) -> list[Quarantined]:
        """Everything set aside, as quarantine rows (``stage = 'import'``)."""
        records = [
            Quarantined(
                f"file:{q.path}" + (f"#{q.position}" if q.position else ""),
                "import",
                "unreadable_record",
                "skipped",
                str(q),
            )
            for q in self.report.quarantined
        ]
        records += [
            Quarantined(sid, "import", "unencodable_session", "skipped", why)
            for sid, why in self.failed
            if sid not in self.refused
        ]
        records += self.admission
        if self.attached is not None:
            records += self.attached.quarantine_records()
        return records


def import_runs(
    settings: Settings,
    paths: list[Path],
    producer: EventProducer,
    *,
    format: str = "auto",
    verdicts: Path | None = None,
    progress: Progress | None = None,
) -> ImportRun:
    """Import ``paths`` (sessions sent whole) and attach the verdicts under ``verdicts``.

    With paths, verdicts join the imported sessions of their instance (unless a session brought its
    own); without, they are attached to the assembled sessions of their instance
    (:func:`pipelines.intake.verdicts.attach_verdicts`). Everything set aside is recorded in ``quarantine``.

    Raises:
        ImportFormatError: an unknown format name, or a ``verdicts`` path that does not exist.

    ``progress`` is told of each path imported.
    """
    run = ImportRun()
    sender = SessionSender(producer, import_door, settings.max_event_bytes, key=door_key(settings.home_dir))
    if paths:
        files = read_verdicts(verdicts)[0] if verdicts is not None else []
        tasks: set[str] = set()

        def send(session: ImportedSession) -> None:
            tasks.add(session.task_id)
            if files:
                with_verdicts(session, files)
            sender(session)

        run.report = import_paths(paths, format=format, send=send, progress=progress)
        if verdicts is not None:
            run.verdict_instances, run.unmatched_verdicts = _match(files, tasks)
    elif verdicts is not None:
        run.attached = attach_verdicts(Lakehouse.open(settings), verdicts, producer.emit)
    run.failed = [(session.session_id, why) for session, why in sender.failed]
    run.admission, run.refused = sender.records, sender.refused
    failed = {sid for sid, _ in run.failed}
    run.report.summaries = [s for s in run.report.summaries if s.session_id not in failed]
    producer.flush()
    records = run.quarantine_records()
    if records:
        record_quarantine(Lakehouse.open(settings), records, run_id())
    return run


def _match(files: list[VerdictFile], tasks: set[str]) -> tuple[list[str], list[str]]:
    """The instances the verdict files judge, and those no imported session is (exact instance ids)."""
    judged = {
        instance
        for found in files
        for instance, verdict in found.verdicts.items()
        if verdict.instance_id == instance  # an alias spelling is the same instance, counted once
    }
    unmatched = [i for i in judged if i not in tasks and instance_alias(i) not in tasks]
    return sorted(judged), sorted(unmatched)


def listen(
    address: str,
    producer: EventProducer,
    on_session: Callable[[ImportedSession], Any] | None = None,
    token: str | None = None,
    *,
    credentials: dict[str, str] | None = None,
    settings: Settings | None = None,
) -> Any:
    """An OTLP/HTTP receiver on ``address`` (``host:port``) sending each conversation to Kafka; started, not joined.

    Args:
        token: the bearer token every request must carry (one client); required for a non-loopback host
            unless ``credentials`` are given.
        credentials: client name -> token (``TRAJLAKE_OTLP_TOKENS_FILE``): each request is the client whose
            token it carries, and a conversation belongs to the client that opened it.
        settings: where the gate's quarantine rows go (origins restamped, sessions refused); None: not recorded.

    Raises:
        ConfigError: ``address`` is not ``host:port``, or is not loopback and no token was given.
    """
    from producers.importers.otlp_receiver import OtlpReceiver

    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:4318
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen wants host:port, got {address!r}")
    sender = SessionSender(producer, otlp_door, settings.max_event_bytes if settings else 1 << 20)
    sender.key = door_key(settings.home_dir) if settings is not None else None

    def send(session: ImportedSession) -> None:
        sender(session)
        producer.flush()
        records, sender.records = sender.records, []
        if records and settings is not None:
            record_quarantine(Lakehouse.open(settings), records, run_id())
        if on_session is not None:
            on_session(session)

    try:
        receiver = OtlpReceiver(send, host, int(port), token=token, credentials=credentials)
    except OSError as exc:  # address in use, not this machine's, not resolvable
        raise ConfigError(f"--listen {address}: cannot listen there ({exc.strerror or exc})") from None
    return receiver.start()
