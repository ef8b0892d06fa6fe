"""Verdicts attached after the runs were imported (``trajlake import --verdicts PATH``).

A harness report often arrives after the runs: this finds the sessions each verdict is about
(the assembled sessions whose ``task_id`` is exactly the verdict's instance: a task family's name
or a prefix of an id matches nothing) and sends
one ``evaluation`` per session (``producers.importers.verdicts.verdict_event``): provenance from the
report (``harness_report``, ``harbor_verifier``), host ``verdicts``, an id derived from the session
and the verdict, so attaching the same report twice changes nothing; signed with the installation's door
key (``pipelines.intake.admission``), so no other sender can speak for this door. Assembly counts it when its
provenance is trusted (``pipelines.intake.ownership``).

A verdict on an instance no session has is reported and kept in the quarantine table
(``stage = 'import'``, ``reason = 'unknown_instance'``), never dropped silently; import the runs and
attach again. A verdict on an instance several sessions share (several runs of one task) goes to
each and the report says how many.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.intake.admission import admit_verdict, door_key
from pipelines.intake.quarantine import Quarantined
from producers.importers.verdicts import Verdict, read_verdicts, verdict_event
from producers.sdk import Event
from warehouse.lakehouse import Lakehouse

_SESSIONS_SQL = """
SELECT session_id, task_id, task_family, task_type, sandbox_id, image_name, image_version, agent_name,
       agent_version, agent_model, policy_version, max_seq, last_event_at
FROM trajectories
WHERE task_id IN (SELECT unnest($ids::VARCHAR[]))
ORDER BY session_id
"""


@dataclass
class Attached:
    """What ``attach_verdicts`` did."""

    files: int = 0
    attached: list[tuple[str, str, bool]] = field(default_factory=list)  # (instance, session, passed)
    unknown: list[Verdict] = field(default_factory=list)
    unevaluated: list[str] = field(default_factory=list)  # instances the harness could not evaluate
    shared: dict[str, int] = field(default_factory=dict)  # instance -> sessions it went to, when more than one
    errors: list[str] = field(default_factory=list)

    @property
    def instances(self) -> int:
        """How many instances the files give a verdict on (each spelling of an instance once)."""
        return len({instance for instance, _, _ in self.attached}) + len(self.unknown)

    def quarantine_records(self) -> list[Quarantined]:
        """The quarantine rows of the verdicts no session took (``stage = 'import'``)."""
        return [
            Quarantined(
                f"verdict:{v.instance_id}",
                "import",
                "unknown_instance",
                "kept_aside",
                f"{v.source}: verdict passed={v.passed} reward={v.reward} ({v.provenance}) on an instance "
                "no assembled session has",
            )
            for v in self.unknown
        ]


def _micros(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000)
    return int(value or 0)


def attach_verdicts(lake: Lakehouse, path: Path | str, sink: Callable[[Event], Any]) -> Attached:
    """Send an evaluation to every assembled session a verdict under ``path`` is about.

    Args:
        lake: the lakehouse (the sessions are looked up in ``trajectories``).
        path: a verdict file or a directory of them.
        sink: receives each evaluation event (``EventProducer.emit``).

    Raises:
        ImportFormatError: ``path`` does not exist.
    """
    files, errors = read_verdicts(path)
    result = Attached(files=len(files), errors=errors)
    verdicts: dict[str, Verdict] = {}
    for found in files:
        result.unevaluated += found.unevaluated
        for instance, verdict in found.verdicts.items():
            verdicts.setdefault(instance, verdict)
    if not verdicts:
        return result
    con = lake.views()
    try:
        cursor = con.execute(_SESSIONS_SQL, {"ids": sorted(verdicts)})
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall()
    finally:
        con.close()
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        record = dict(zip(columns, row, strict=True))
        sessions.setdefault(str(record["task_id"]), []).append(record)
    sent: set[tuple[str, str]] = set()
    key = door_key(lake.home)
    for instance, verdict in sorted(verdicts.items()):
        targets = sessions.get(instance, [])
        if not targets:
            if verdict.instance_id == instance:  # an alias spelling of an instance is not reported twice
                result.unknown.append(verdict)
            continue
        if len(targets) > 1:
            result.shared[instance] = len(targets)
        for session in targets:
            if (session["session_id"], verdict.instance_id) in sent:
                continue
            sent.add((session["session_id"], verdict.instance_id))
            ts = _micros(session["last_event_at"]) + 1000
            event = verdict_event(session, verdict, seq=int(session["max_seq"] or 0) + 1, ts=ts)
            sink(admit_verdict(event, key))  # signed: the one door that may judge a session it does not own
            result.attached.append((instance, session["session_id"], verdict.passed))
    return result


def run_id() -> str:
    """An id for the quarantine rows of one ``trajlake import`` run."""
    return f"import-{uuid.uuid4().hex[:12]}"
