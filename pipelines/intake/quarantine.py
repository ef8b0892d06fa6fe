"""The ``quarantine`` table: sessions a stage could not take as they are, with the reason.

One bad session never stops a stage for every other session. Assembly and export record
here what they did instead (``warehouse.tables.QUARANTINE``):

* ``action = 'nulled'``: the session landed, with the offending values NULL in the wide
  tables (a non-finite or out-of-range number, a sum beyond int64); the raw event keeps
  the original value.
* ``action = 'skipped'``: the session could not be assembled or exported at all; it is
  left out of that stage's output and counted.
* ``action = 'excluded'`` (``reason = 'foreign_producer'``, or ``'ownership_conflict'`` for a
  ``session_start``): an event from an identity other than the one whose event for the session was
  admitted first, left out of it (``pipelines.intake.ownership``).
* ``action = 'not_counted'`` (``reason = 'untrusted_verdict'`` or ``'lower_verdict'``): a verdict whose
  provenance is not trusted, or ranks below the session's counted one (``pipelines.intake.precedence``);
  it stays in ``events`` but sets no ``eval_passed`` or reward.
* ``reason = 'unverified_door'`` (``excluded``): an evaluation claiming the verdicts door without its
  signature; ``'origin_mismatch'`` (``flagged``): a declared origin the door does not allow, recorded as
  the door's; ``'secret_in_token_strings'`` (``skipped``): a model call's tokens spell a secret, the
  session stays out; at the door (``stage = 'import'``) ``'oversized_event'``, ``'unredacted_secret'``
  (``skipped``) and ``'redacted_at_gate'`` (``redacted``) (``pipelines.intake.admission``).
* ``action = 'kept_head'`` (``reason = 'incomplete_parts'``): a text that travelled in parts could
  not be rebuilt whole; the event keeps its first part, marked truncated (``pipelines.intake.parts``).
* ``stage = 'import'``: a record of a recorded run that ``trajlake import`` could not take (its
  file and line or trial in ``detail``).

Assembly replaces a session's ``assemble`` rows whenever it recomputes the session (a
fixed session leaves the quarantine); export rows accumulate, one set per export id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyiceberg.expressions import And, EqualTo, In, Reference
from pyiceberg.expressions.literals import literal

from producers.redact import redact_text
from warehouse.lakehouse import Lakehouse
from warehouse.snapshots import current_files
from warehouse.sql import connect, parquet_source
from warehouse.tables import QUARANTINE
from warehouse.transactions import retry_on_conflict, transaction

#: Longest ``detail`` kept (error messages can quote whole values).
DETAIL_CHARS = 500


@dataclass(frozen=True)
class Quarantined:
    """One quarantine record: which session, at which stage, why, and what was done."""

    session_id: str
    stage: str
    reason: str
    action: str
    detail: str
    event_id: str | None = None


def quarantine_rows(records: Iterable[Quarantined], run_id: str, now: datetime | None = None) -> pa.Table:
    """The ``quarantine`` table rows of ``records``."""
    now = now or datetime.now(UTC)
    # a row quotes its input (an instance id, a file's path, a value in an error): redacted like any event
    rows = [
        {
            "session_id": redact_text(r.session_id),
            "stage": r.stage,
            "reason": r.reason,
            "action": r.action,
            "detail": redact_text(r.detail[:DETAIL_CHARS]),
            "event_id": redact_text(r.event_id) if r.event_id else r.event_id,
            "run_id": run_id,
            "quarantined_at": now,
        }
        for r in records
    ]
    return pa.Table.from_pylist(rows, schema=QUARANTINE.arrow_schema())


def record_quarantine(
    lake: Lakehouse,
    records: list[Quarantined],
    run_id: str,
    replace_stage: str | None = None,
    recomputed: list[str] | None = None,
) -> None:
    """Append ``records``; with ``replace_stage``, first drop that stage's rows of the ``recomputed`` sessions.

    Raises:
        CommitConflict: the table kept changing under every attempt.
    """
    recomputed = recomputed or []

    def attempt() -> None:
        table = lake.table(QUARANTINE.name)
        stale: list[str] = []
        files = current_files(table).paths
        if replace_stage and recomputed and files:
            con = connect()
            try:
                con.execute("CREATE TEMP TABLE recomputed AS SELECT unnest($ids) AS session_id", {"ids": recomputed})
                stale = [
                    sid
                    for (sid,) in con.execute(
                        f"SELECT DISTINCT session_id FROM {parquet_source(files)} "
                        "WHERE stage = $stage AND session_id IN (SELECT session_id FROM recomputed)",
                        {"stage": replace_stage},
                    ).fetchall()
                ]
            finally:
                con.close()
        if not stale and not records:
            return
        with transaction(table) as tx:
            if stale:
                stage = EqualTo(term=Reference("stage"), value=literal(replace_stage))
                tx.delete(And(stage, In(term=Reference("session_id"), literals={literal(s) for s in stale})))
            if records:
                tx.append(quarantine_rows(records, run_id))

    retry_on_conflict("record quarantined sessions", attempt)
