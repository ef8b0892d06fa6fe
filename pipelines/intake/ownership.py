"""Who a session belongs to, and whose verdicts count: the rules assembly applies before it aggregates.

**Session ownership.** A session belongs to the producer that started it. A producer's identity
is its ``host_id``, the kind of source (``extra['source_kind']``: ``import`` for imported runs,
none for the fleet) and, for an import, the sha256 of the recorded file
(``extra['source_sha256']``). The owner is the identity of the session's first ``session_start``
by ``(seq, event_id)`` (without one, of its first event), so it does not depend on the order
events arrive in; when several producers sent a ``session_start`` for one id the first owns it and
the quarantine says so (``reason = 'ownership_conflict'``). Events of the session from any other
identity are *foreign*: quarantined (``reason = 'foreign_producer'``, ``action = 'excluded'``) and
left out of the session's rows, so an imported file or another host that claims a session id can
neither add steps to it nor change its verdict.

**Verdict provenance.** An ``evaluation`` says who stands behind it (``provenance``, schema v4;
an owner's event without one is its own evaluator, ``fleet_evaluator``). Only provenances in
``TRAJLAKE_TRUSTED_VERDICTS`` set ``eval_passed``, the test counts and the reward; any other verdict
(``self_reported`` by default: a reward the agent's own file claims) stays in ``events`` and is
named in the quarantine (``reason = 'untrusted_verdict'``, ``action = 'not_counted'``). A verdict
that arrives later from another source (``trajlake import --verdicts``) is an evaluation of a
foreign identity: it counts when its provenance is trusted, but a foreign event can never claim
to be the owner's own evaluator.
"""

from __future__ import annotations

import duckdb

from pipelines.intake.quarantine import Quarantined

#: The provenance an owner's evaluation without one has (the producer's own evaluator).
OWN_EVALUATOR = "fleet_evaluator"

_IDENTITY = (
    "host_id || chr(31) || coalesce(extra['source_kind'], '') || chr(31) || coalesce(extra['source_sha256'], '')"
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
    """Drop foreign events from ``ev`` and stop untrusted verdicts from counting; one record per event.

    Untrusted verdicts stay in ``ev`` as ``event_type = 'evaluation_not_counted'`` (so the session's
    sequence numbers stay whole); foreign events leave it.

    Args:
        con: a connection holding the temp table ``ev`` (one chunk's deduplicated events).
        trusted: the provenances whose verdicts count.
    """
    provenance = _provenance_sql(con)
    untrusted_filter = (
        f"ev.event_type = 'evaluation' AND coalesce({provenance}, '{OWN_EVALUATOR}') "
        "NOT IN (SELECT unnest($trusted::VARCHAR[]))"
    )
    # the common case, one producer per session and only trusted verdicts, costs one aggregate and one filter
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE ev_mixed AS
        SELECT session_id FROM (SELECT session_id, {_IDENTITY} AS identity FROM ev)
        GROUP BY session_id HAVING min(identity) <> max(identity)
        """
    )
    mixed = con.execute("SELECT count(*) FROM ev_mixed").fetchone()
    counted = con.execute(f"SELECT count(*) FROM ev WHERE {untrusted_filter}", {"trusted": list(trusted)}).fetchone()
    if not (mixed and mixed[0]) and not (counted and counted[0]):
        con.execute("DROP TABLE ev_mixed")
        return []
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE ev_owner AS
        SELECT session_id,
               arg_min(identity, struct_pack(k := CASE WHEN event_type = 'session_start' THEN 0 ELSE 1 END,
                                             seq, event_id)) AS owner,
               count(DISTINCT identity) FILTER (event_type = 'session_start') AS starters
        FROM (SELECT session_id, event_type, seq, event_id, {_IDENTITY} AS identity FROM ev
              WHERE session_id IN (SELECT session_id FROM ev_mixed))
        GROUP BY session_id
        """
    )
    found = con.execute(
        f"""
        SELECT ev.session_id, ev.event_id, ev.event_type, {_IDENTITY} AS identity, {provenance} AS provenance,
               o.owner IS NULL OR {_IDENTITY} = o.owner AS own
        FROM ev LEFT JOIN ev_owner o USING (session_id)
        WHERE (o.owner IS NOT NULL AND {_IDENTITY} <> o.owner) OR ({untrusted_filter})
        """,
        {"trusted": list(trusted)},
    ).fetchall()
    conflicts = con.execute("SELECT session_id, starters FROM ev_owner WHERE starters > 1").fetchall()
    con.execute("DROP TABLE ev_owner")
    con.execute("DROP TABLE ev_mixed")
    if not found:
        return []
    foreign: list[str] = []
    untrusted: list[str] = []
    records = [
        Quarantined(
            session_id,
            "assemble",
            "ownership_conflict",
            "kept_first",
            f"{n} producers started this session; the first session_start by (seq, event_id) owns it",
        )
        for session_id, n in conflicts
    ]
    for session_id, event_id, event_type, identity, given, own in found:
        claims_own = event_type == "evaluation" and (given is None or given == OWN_EVALUATOR)
        trusted_verdict = event_type == "evaluation" and given in trusted and not claims_own
        who = identity.replace("\x1f", " / ").strip(" /")
        if not own and not trusted_verdict and (event_type != "evaluation" or claims_own):
            foreign.append(event_id)
            detail = f"{event_type} from {who}, not the producer that started the session"
            records.append(Quarantined(session_id, "assemble", "foreign_producer", "excluded", detail, event_id))
        elif (
            event_type == "evaluation"
            and not trusted_verdict
            and not (own and given is None and OWN_EVALUATOR in trusted)
        ):
            # a foreign verdict that does not count leaves the session; the owner's own stays in it, not counted
            (untrusted if own else foreign).append(event_id)
            detail = f"verdict of provenance {given or OWN_EVALUATOR} from {who} (trusted: {', '.join(trusted)})"
            records.append(Quarantined(session_id, "assemble", "untrusted_verdict", "not_counted", detail, event_id))
    if foreign:
        con.execute("DELETE FROM ev WHERE event_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": foreign})
    if untrusted:
        con.execute(
            "UPDATE ev SET event_type = 'evaluation_not_counted' WHERE event_id IN (SELECT unnest($ids::VARCHAR[]))",
            {"ids": untrusted},
        )
    return records


def verdict_provenance_sql(con: duckdb.DuckDBPyConnection) -> str:
    """The SQL expression of an ``ev`` evaluation's provenance (the owner's own evaluator when unset)."""
    return f"coalesce({_provenance_sql(con)}, '{OWN_EVALUATOR}')"
