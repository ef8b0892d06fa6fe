"""Who a session belongs to, and whose verdict counts: the admission rules assembly applies before it aggregates.

**The identity a door authenticated.** Every way in stamps who sent an event: the Kafka door (a sandbox
host, the producer SDK) its ``host_id``; ``trajlake import`` the kind of source
(``extra['source_kind'] = 'import'``) and the sha256 of the recorded file (``extra['source_sha256']``);
verdict files ``source_kind = 'verdicts'`` (signed: :mod:`pipelines.intake.admission` verifies it first); the
OTLP receiver the client that posted the spans (``extra['otlp_client']``: ``client:<name>`` of its credential,
or a fingerprint of what it carried when no credentials are configured). The identity is all of these together.

**Ownership by arrival.** A session belongs to the identity of its first *admitted* event: the first
in the order events were taken into the lakehouse (``ingested_at``, then the record's Kafka topic,
partition and offset, i.e. the broker's log order for a partition), never the lowest claimed ``seq``
or ``event_id``. Once stored, that first event stays first, so no later event can reassign the
session. An event of any other identity is *foreign*: quarantined and left out of the session's rows
-- a ``session_start`` as ``reason = 'ownership_conflict'``, anything else as ``'foreign_producer'``
(``action = 'excluded'``) -- so another host, an imported file or another OTLP client that claims a
session id can neither add steps to it nor change its verdict. Duplicates (one ``event_id`` twice) are
duplicates only within one identity (``pipelines.assemble``): a foreign copy of an owner's event id is
quarantined, never taken for the owner's.

**Verdicts.** The one foreign identity whose events may stay is the verdicts door
(``source_kind = 'verdicts'``, a harness report matched to the session) and only for an ``evaluation``
of a trusted provenance other than the owner's evaluator. Which verdict then counts is the one
precedence of :mod:`pipelines.intake.precedence`: an owner's evaluation with a provenance outside
``TRAJLAKE_TRUSTED_VERDICTS`` stays as ``evaluation_not_counted`` (``untrusted_verdict``); a counted
candidate of a lower rank than the session's highest stays the same way (``lower_verdict``); a
foreign verdict that does not count leaves the session (``action = 'not_counted'`` either way).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import duckdb

from pipelines.intake.precedence import OWN_EVALUATOR, rank, rank_sql
from pipelines.intake.quarantine import Quarantined

#: ``extra['source_kind']`` of verdicts attached after the runs (``producers.importers.verdicts.LATE_HOST``).
VERDICTS_DOOR = "verdicts"

#: The identity of an event's sender (SQL over a raw-events row; parts joined by U+001F).
IDENTITY_SQL = (
    "host_id || chr(31) || coalesce(extra['source_kind'], '') || chr(31) || coalesce(extra['source_sha256'], '')"
    " || chr(31) || coalesce(extra['otlp_client'], '')"
)

#: The order events were admitted in (SQL over a raw-events row): ingest time, then the broker's log order.
ARRIVAL_SQL = (
    "struct_pack(a := coalesce(ingested_at, TIMESTAMPTZ '9999-12-31 00:00:00+00'), t := coalesce(kafka_topic, ''),"
    " p := coalesce(kafka_partition, 2147483647), o := coalesce(kafka_offset, 9223372036854775807),"
    " e := event_id)"
)


def has_payload_field(con: duckdb.DuckDBPyConnection, column: str, field: str, table: str = "ev") -> bool:
    """Whether ``table``'s struct column ``column`` has ``field`` (raw files written before schema v4 lack it)."""
    rows = con.execute(
        "SELECT data_type FROM information_schema.columns WHERE table_name = $table AND column_name = $column",
        {"table": table, "column": column},
    ).fetchall()
    return bool(rows) and f"{field} " in str(rows[0][0]).lower().replace('"', "")


def _provenance_sql(con: duckdb.DuckDBPyConnection) -> str:
    return "evaluation.provenance" if has_payload_field(con, "evaluation", "provenance") else "NULL::VARCHAR"


def apply_ownership(con: duckdb.DuckDBPyConnection, trusted: tuple[str, ...]) -> list[Quarantined]:
    """Admit ``ev``'s events: drop foreign ones, keep only the verdicts that count; one record per event set aside.

    Verdicts that do not count but belong to the owner stay in ``ev`` as ``event_type =
    'evaluation_not_counted'`` (so the session's sequence numbers stay whole); foreign events leave it.

    Args:
        con: a connection holding the temp table ``ev`` (one chunk's deduplicated events, with the
            ingest columns ``ingested_at`` and ``kafka_*``).
        trusted: the provenances whose verdicts count.
    """
    provenance = _provenance_sql(con)
    ranked = rank_sql(provenance)
    params = {"trusted": list(trusted)}
    # the common case -- one identity per session, trusted verdicts of one rank -- costs one aggregate
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE ev_flagged AS
        SELECT session_id FROM (
            SELECT session_id, {IDENTITY_SQL} AS identity,
                   CASE WHEN event_type = 'evaluation' THEN {ranked} END AS rank,
                   CASE WHEN event_type = 'evaluation'
                        THEN coalesce({provenance}, '{OWN_EVALUATOR}') IN (SELECT unnest($trusted::VARCHAR[])) END
                        AS counts
            FROM ev)
        GROUP BY session_id
        HAVING min(identity) <> max(identity) OR NOT bool_and(coalesce(counts, true)) OR min(rank) <> max(rank)
        """,
        params,
    )
    flagged = con.execute("SELECT count(*) FROM ev_flagged").fetchone()
    if not (flagged and flagged[0]):
        con.execute("DROP TABLE ev_flagged")
        return []
    rows = con.execute(
        f"""
        WITH mine AS (
            SELECT rowid AS row_id, session_id, event_id, event_type, {IDENTITY_SQL} AS identity,
                   {provenance} AS provenance, extra['source_kind'] AS door, {ARRIVAL_SQL} AS arrival
            FROM ev WHERE session_id IN (SELECT session_id FROM ev_flagged)
        ),
        -- the verdicts door speaks of sessions, it never owns one: the first other identity does (a session of
        -- verdicts alone keeps its first one until the session's own events come)
        owners AS (
            SELECT session_id,
                   coalesce(arg_min(identity, arrival) FILTER (WHERE door IS DISTINCT FROM '{VERDICTS_DOOR}'),
                            arg_min(identity, arrival)) AS owner
            FROM mine GROUP BY session_id)
        SELECT row_id, session_id, event_id, event_type, identity, provenance, door, identity = owner AS own
        FROM mine JOIN owners USING (session_id)
        WHERE identity <> owner OR event_type = 'evaluation'
        """
    ).fetchall()
    con.execute("DROP TABLE ev_flagged")
    drop, keep_uncounted, records = _admit(rows, trusted)
    if drop:
        con.execute("DELETE FROM ev WHERE rowid IN (SELECT unnest($ids::BIGINT[]))", {"ids": drop})
    if keep_uncounted:
        con.execute(
            "UPDATE ev SET event_type = 'evaluation_not_counted' WHERE rowid IN (SELECT unnest($ids::BIGINT[]))",
            {"ids": keep_uncounted},
        )
    return records


def _admit(rows: list[tuple[Any, ...]], trusted: tuple[str, ...]) -> tuple[list[int], list[int], list[Quarantined]]:
    """The rows to drop, the owner's verdicts to keep uncounted, and why, for the foreign events and verdicts."""
    drop: list[int] = []
    uncounted: list[int] = []
    records: list[Quarantined] = []
    candidates: dict[str, list[tuple[int, str, str | None, bool, str]]] = defaultdict(list)
    for row_id, session_id, event_id, event_type, identity, given, door, own in rows:
        who = identity.replace("\x1f", " / ").strip(" /")
        is_verdict = event_type == "evaluation"
        claims_own = given is None or given == OWN_EVALUATOR
        if not own and not (is_verdict and door == VERDICTS_DOOR and not claims_own):
            drop.append(row_id)
            reason = "ownership_conflict" if event_type == "session_start" else "foreign_producer"
            detail = f"{event_type} from {who}; the session belongs to the identity whose event was admitted first"
            records.append(Quarantined(session_id, "assemble", reason, "excluded", detail, event_id))
        elif (given or OWN_EVALUATOR) not in trusted:
            (uncounted if own else drop).append(row_id)
            detail = f"verdict of provenance {given or OWN_EVALUATOR} from {who} (trusted: {', '.join(trusted)})"
            records.append(Quarantined(session_id, "assemble", "untrusted_verdict", "not_counted", detail, event_id))
        else:
            candidates[session_id].append((row_id, event_id, given, own, who))
    for session_id, verdicts in candidates.items():
        top = max(rank(given) for _, _, given, _, _ in verdicts)
        for row_id, event_id, given, own, who in verdicts:
            if rank(given) < top:
                (uncounted if own else drop).append(row_id)
                detail = (
                    f"verdict of provenance {given or OWN_EVALUATOR} from {who} ranks below the session's "
                    "counted verdict; a lower provenance never replaces a higher one"
                )
                records.append(Quarantined(session_id, "assemble", "lower_verdict", "not_counted", detail, event_id))
    return drop, uncounted, records


def verdict_provenance_sql(con: duckdb.DuckDBPyConnection) -> str:
    """The SQL expression of an ``ev`` evaluation's provenance (the owner's own evaluator when unset)."""
    return f"coalesce({_provenance_sql(con)}, '{OWN_EVALUATOR}')"
