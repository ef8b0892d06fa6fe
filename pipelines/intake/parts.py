"""Whole texts rebuilt from their parts: a text too large for one event arrives split (``producers.parts``).

Assembly calls :func:`rebuild_parts` on each chunk's events before it aggregates them, so
``steps.output`` (the submission too), ``steps.thought`` / ``arguments`` / ``command`` and
``trajectories.instruction`` hold the whole text. A whole is accepted only when every part is
there and its sha256 matches; otherwise the event keeps its head, ``env_feedback.truncated`` says
so, and the quarantine names the session (``reason = 'incomplete_parts'``, ``action = 'kept_head'``):
nothing is cut silently. The parts themselves stay in ``events`` as ``annotation`` rows.

Model-call blobs split the same way are read back by :func:`blob_texts` (export's lookup).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import duckdb

from pipelines.intake.ownership import has_payload_field
from pipelines.intake.quarantine import Quarantined
from producers.parts import BLOB_FIELD, SPLITTABLE
from warehouse.tables import RAW_EVENTS

_PARTS = "event_type = 'annotation' AND annotation.part_of_field IS NOT NULL"


def rebuild_parts(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    """Put the whole texts back into ``ev``'s events (see the module docstring); one record per incomplete text.

    The common case (no part in the chunk) costs one count over ``ev``.
    """
    if not has_payload_field(con, "annotation", "part_of_field"):
        return []
    counted = con.execute(f"SELECT count(*) FROM ev WHERE {_PARTS} AND annotation.part_of_field <> '{BLOB_FIELD}'")
    row = counted.fetchone()
    if not row or not row[0]:
        return []
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE ev_parts AS
        SELECT parent_event_id AS event_id, annotation.part_of_field AS field,
               any_value(annotation.whole_sha256) AS whole_sha256, max(annotation.part_count) AS part_count,
               count(DISTINCT annotation.part_index) AS n_parts,
               string_agg(annotation.value, '' ORDER BY annotation.part_index) AS rest
        FROM ev WHERE {_PARTS} AND annotation.part_of_field <> '{BLOB_FIELD}' AND parent_event_id IS NOT NULL
        GROUP BY ALL
        """
    )
    schema = RAW_EVENTS.arrow_schema()
    fields = [(kind, name) for kind, names in SPLITTABLE.items() for name in names]
    pivot = ", ".join(
        f"max(CASE WHEN field = '{kind}.{name}' THEN rest END) AS rest_{kind}__{name}, "
        f"max(CASE WHEN field = '{kind}.{name}' THEN whole_sha256 END) AS sha_{kind}__{name}, "
        f"bool_or(field = '{kind}.{name}' AND n_parts = part_count - 1) AS full_{kind}__{name}"
        for kind, name in fields
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE ev_whole AS SELECT event_id, {pivot} FROM ev_parts GROUP BY event_id")
    checks = " OR ".join(f"(w.rest_{k}__{n} IS NOT NULL AND NOT coalesce({_whole_ok(k, n)}, false))" for k, n in fields)
    broken = con.execute(
        f"SELECT e.session_id, e.event_id, e.event_type FROM ev e JOIN ev_whole w USING (event_id) WHERE {checks}"
    ).fetchall()
    replaced = []
    for kind in SPLITTABLE:
        names = {name for k, name in fields if k == kind}
        members = []
        for child in schema.field(kind).type:
            value = f"e.{kind}.{child.name}"
            if child.name in names:
                rest = f"w.rest_{kind}__{child.name}"
                whole = _whole_ok(kind, child.name)
                members.append(
                    f"{child.name} := CASE WHEN {rest} IS NOT NULL AND {whole} THEN {value} || {rest} ELSE {value} END"
                )
            elif kind == "env_feedback" and child.name == "truncated":
                whole_output = _whole_ok("env_feedback", "output")
                cut = f"(w.rest_env_feedback__output IS NOT NULL AND NOT coalesce({whole_output}, false))"
                members.append(f"truncated := {value} OR {cut}")
            else:
                members.append(f"{child.name} := {value}")
        packed = f"struct_pack({', '.join(members)})"
        replaced.append(f"CASE WHEN e.{kind} IS NULL OR w.event_id IS NULL THEN e.{kind} ELSE {packed} END AS {kind}")
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE ev AS SELECT e.* REPLACE ({', '.join(replaced)}) "
        "FROM ev e LEFT JOIN ev_whole w USING (event_id)"
    )
    con.execute("DROP TABLE ev_parts")
    con.execute("DROP TABLE ev_whole")
    return [
        Quarantined(
            session_id,
            "assemble",
            "incomplete_parts",
            "kept_head",
            f"{event_type}: a text split into parts is missing parts or does not match its sha256",
            event_id,
        )
        for session_id, event_id, event_type in broken
    ]


def _whole_ok(kind: str, name: str) -> str:
    """SQL: every part of ``kind.name`` arrived and the rebuilt whole matches its sha256."""
    whole = f"e.{kind}.{name} || w.rest_{kind}__{name}"
    return f"(w.full_{kind}__{name} AND sha256({whole}) = w.sha_{kind}__{name})"


def blob_texts(con: duckdb.DuckDBPyConnection, refs: Iterable[str], source: str = "events") -> dict[str, str]:
    """Model-call blob texts that travelled in parts, by sha256, for the wanted ``refs`` (whole and verified only).

    Args:
        con: a connection where ``source`` (a view or table of raw events) is readable.
        refs: the content refs (sha256 of the text) wanted.
        source: the relation holding the events.
    """
    wanted = sorted(set(refs))
    if not wanted:
        return {}
    try:
        rows = con.execute(
            f"SELECT annotation.whole_sha256, string_agg(annotation.value, '' ORDER BY annotation.part_index), "
            "max(annotation.part_count), count(DISTINCT annotation.part_index) "
            f"FROM {source} WHERE {_PARTS} AND annotation.part_of_field = '{BLOB_FIELD}' "
            "AND annotation.whole_sha256 IN (SELECT unnest($refs::VARCHAR[])) GROUP BY 1",
            {"refs": wanted},
        ).fetchall()
    except duckdb.BinderException:  # events written before schema v4 have no part fields
        return {}
    texts = {}
    for sha, text, count, parts in rows:
        if text is not None and parts == count and hashlib.sha256(text.encode()).hexdigest() == sha:
            texts[sha] = text
    return texts


__all__ = ["blob_texts", "rebuild_parts"]
