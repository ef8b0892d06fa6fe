"""The admission stage: the one gate every way in passes, with every rule of trust in one place.

Two halves, one module. **At the door** (:func:`admit_session`, :func:`admit_verdict`): the doors this
installation runs itself -- ``trajlake import`` (files), the OTLP receiver (``import --listen``) and verdict
files (``import --verdicts``) -- hand each session here before it is encoded for Kafka. **At assembly**
(:func:`admit`): every event, whatever door it came through (a sandbox host or any producer-SDK host writes
to Kafka directly, and the doors above reach the lakehouse through Kafka too), passes here before it is
aggregated. Doors keep their parsing and the identity they authenticated; the rules are these:

* **Identity** (who sent it): a Kafka host its ``host_id``; an import the file's sha256 and
  ``extra['source_kind'] = 'import'``; the OTLP receiver the client credential that posted the spans
  (``extra['otlp_client']``: ``client:<name>`` from ``TRAJLAKE_OTLP_TOKENS_FILE``, else a fingerprint);
  verdict files ``extra['source_kind'] = 'verdicts'``, **signed**: the one door whose events may change a
  session it does not own carries a keyed digest (``extra['door_mac']``, the key in ``TRAJLAKE_HOME/door.key``
  that only this installation's doors and assembly read). An evaluation that claims the verdicts door without
  a valid digest -- another host's "harness report" on the wire -- is excluded (``unverified_door``).
  The import and OTLP doors sign every event they admit the same way (:func:`sign_door`: its id, session,
  type, ``seq``, host and door markers), because their markers can be copied (an import's sha256 is a
  public file's): where a door signed a session, an event wearing that identity unsigned is excluded too.
* **Ownership by arrival and the one verdict precedence**: :mod:`pipelines.intake.ownership`,
  :mod:`pipelines.intake.precedence`.
* **Origin** is the door's, never the payload's: the import door stamps ``import:<format>``, the OTLP door
  ``otlp``; the fleet's own code path ``sandbox`` or ``synthetic``, any other Kafka host ``sdk`` (the only
  origins a Kafka host can have). A declared ``extra['origin']`` that disagrees is kept as
  ``extra['declared_origin']`` and the door's origin is recorded instead, with a quarantine row
  (``reason = 'origin_mismatch'``, ``action = 'flagged'``): the session's data is not wrong, only its label,
  so it stays, counted under the origin it really has (a file claiming ``sandbox`` cannot enter the
  sandbox-only training sets, a synthetic host cannot pass as an import).
* **Size**: a session whose event does not fit ``TRAJLAKE_MAX_EVENT_BYTES`` once encoded is refused whole at
  the door (``oversized_event``), never sent in part to be dead-lettered event by event.
* **Secrets**: the door-side pass is the session-level redaction (``producers.redact.redact_session``):
  importers run it before cutting large texts into parts (a text cut first could hide a secret in the cut),
  and the gate runs it again over what the door hands it; a door that let a secret through has it redacted
  here (no parts) or its session refused (``unredacted_secret``). Token strings of model calls (the RL data:
  ``completion_tokens_text``, whose token ids spell the same text) are checked again at assembly for every
  door, producer-SDK hosts included: a call whose tokens still spell a secret leaves its session out of the
  lakehouse (``secret_in_token_strings``, ``action = 'skipped'``), because its token ids cannot be redacted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from common.errors import ConfigError
from pipelines.intake.ownership import IDENTITY_SQL, VERDICTS_DOOR, apply_ownership, has_payload_field
from pipelines.intake.quarantine import Quarantined
from producers.redact import redact_session, redact_text
from producers.redact.tokens import redact_tokens

#: Origins a door stamps; an import is ``import:<format>``.
KAFKA_ORIGINS = ("sandbox", "synthetic", "sdk")
OTLP_ORIGIN = "otlp"
IMPORT_PREFIX = "import:"
#: The file under ``TRAJLAKE_HOME`` holding the key the verdicts door signs with.
KEY_FILE = "door.key"
#: The SQL variable assembly holds the key in (``SET VARIABLE``), read by :func:`admit`.
KEY_VARIABLE = "trajlake_door_key"
#: The quarantine ``stage`` of what the door-side gate set aside (the doors are ``trajlake import``'s).
DOOR_STAGE = "import"


@dataclass(frozen=True)
class Door:
    """A way in and the identity it authenticated.

    Args:
        kind: ``import``, ``otlp`` or ``verdicts`` (the doors that pass :func:`admit_session`).
        format: an import's format (its origin is ``import:<format>``).
        client: the OTLP client the receiver authenticated.
        key: the installation's door key (:func:`door_key`); with it every event the door admits carries its
            signature (:func:`sign_door`), so no Kafka host can wear the door's identity. None: unsigned.
    """

    kind: str
    format: str | None = None
    client: str | None = None
    key: str | None = field(default=None, repr=False)  # the installation's door key: the door signs what it admits

    @property
    def origin(self) -> str:
        """The origin this door stamps on the sessions it admits."""
        if self.kind == "otlp":
            return OTLP_ORIGIN
        if self.kind == "import":
            return IMPORT_PREFIX + _format_name(self.format or "unknown")
        raise ValueError(f"the {self.kind} door admits no sessions")


def _format_name(text: str) -> str:
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in text.lower()).strip("-._")[:64]
    return name or "unknown"


@dataclass
class Admitted:
    """What the door-side gate did with one session: the events to send, or why none are sent."""

    events: list[dict[str, Any]]
    records: list[Quarantined] = field(default_factory=list)
    refused: str | None = None  # the quarantine reason when the session is not sent


def admit_session(events: list[dict[str, Any]], door: Door) -> Admitted:
    """One session from ``door``, ready to encode: the door's identity and origin stamped, secrets checked.

    The size rule needs the encoded bytes: :func:`check_sizes` after encoding.
    """
    if not events:
        return Admitted([])
    session_id = str(events[0].get("session_id"))
    records: list[Quarantined] = []
    out: list[dict[str, Any]] = []
    for event in events:
        extra = dict(event.get("extra") or {})
        if door.kind == "otlp":
            extra["otlp_client"] = door.client or "anonymous"
        if event.get("event_type") == "session_start":
            declared = extra.get("origin")
            if declared is not None and declared != door.origin:
                extra["declared_origin"] = str(declared)[:200]
                records.append(_origin_record(session_id, event.get("event_id"), str(declared), door.origin, door.kind))
            extra["origin"] = door.origin
        out.append({**event, "extra": extra})
    redacted = list(redact_session(out))
    if redacted != out:
        changed = [a for a, b in zip(out, redacted, strict=True) if a != b]
        if any(_has_parts(e) for e in out):
            # a text cut into parts cannot be redacted part by part: its whole's sha256 would not match
            detail = f"the {door.kind} door handed over a secret in a session whose texts travel in parts"
            refusal = Quarantined(session_id, DOOR_STAGE, "unredacted_secret", "skipped", detail)
            return Admitted([], [*records, refusal], "unredacted_secret")
        detail = f"the {door.kind} door handed over {len(changed)} events with a secret; redacted at the gate"
        records.append(Quarantined(session_id, DOOR_STAGE, "redacted_at_gate", "redacted", detail))
    if door.key is not None:
        redacted = [sign_door(event, door.key) for event in redacted]
    return Admitted(redacted, records)


def _has_parts(event: dict[str, Any]) -> bool:
    extra = event.get("extra") or {}
    payload = event.get("payload") or {}
    return bool(extra.get("parts_of")) or (isinstance(payload, dict) and payload.get("part_of_field") is not None)


def _origin_record(
    session_id: str, event_id: Any, declared: str, origin: str, door: str, stage: str = DOOR_STAGE
) -> Quarantined:
    detail = f"session_start declares origin {declared!r} but came through the {door} door: recorded as {origin!r}"
    return Quarantined(session_id, stage, "origin_mismatch", "flagged", detail, str(event_id or "") or None)


def check_sizes(session_id: str, encoded: list[bytes], max_event_bytes: int) -> Quarantined | None:
    """The refusal of a session one of whose events is larger than ``max_event_bytes`` encoded, else None."""
    sizes = [len(value) for value in encoded]
    if not sizes or max(sizes) <= max_event_bytes:
        return None
    detail = (
        f"an event of {max(sizes)} bytes encoded (TRAJLAKE_MAX_EVENT_BYTES is {max_event_bytes}); "
        "the session is refused whole rather than sent in part"
    )
    return Quarantined(session_id, DOOR_STAGE, "oversized_event", "skipped", detail)


# -- the verdicts door's signature ---------------------------------------------------------------------------


def door_key(home: Path) -> str:
    """The installation's door key (64 hex characters), created on first use (mode 0600).

    Raises:
        ConfigError: the key file exists but holds no key.
    """
    path = Path(home) / KEY_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = secrets.token_hex(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first: use theirs
            return door_key(home)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text + "\n")
        return text
    except UnicodeDecodeError:
        text = ""
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ConfigError(f"{path}: not a door key (64 hex characters); remove it to have a new one made")
    return text


def _verdict_message(event: dict[str, Any]) -> str:
    payload = event.get("payload") or {}
    extra = event.get("extra") or {}
    reward = payload.get("reward")
    parts = [
        event.get("event_id"),
        event.get("session_id"),
        event.get("event_type"),
        event.get("host_id"),
        extra.get("source_kind"),
        payload.get("provenance"),
        "true" if payload.get("passed") else "false",
        "" if reward is None else repr(float(reward)),
    ]
    return "\x1f".join("" if p is None else str(p) for p in parts)


def _mac(key: str, message: str) -> str:
    inner = hashlib.sha256(f"{key}\x1f{message}".encode()).hexdigest()
    return hashlib.sha256(f"{key}\x1f{inner}".encode()).hexdigest()


def admit_verdict(event: dict[str, Any], key: str) -> dict[str, Any]:
    """A verdicts-door ``evaluation`` signed with the installation's door key."""
    extra = {**(event.get("extra") or {}), "source_kind": VERDICTS_DOOR}
    event = {**event, "extra": extra}
    return {**event, "extra": {**extra, "door_mac": _mac(key, _verdict_message(event))}}


#: The same digest in SQL, over a raw-events row (``$key`` bound, or the assembly variable).
_VERDICT_MESSAGE_SQL = (
    "concat_ws(chr(31), coalesce(event_id, ''), coalesce(session_id, ''), coalesce(event_type, ''),"
    " coalesce(host_id, ''), coalesce(extra['source_kind'], ''), coalesce({provenance}, ''),"
    " CASE WHEN evaluation.passed THEN 'true' ELSE 'false' END, coalesce(CAST(evaluation.reward AS VARCHAR), ''))"
)


def _door_message(event: dict[str, Any]) -> str:
    extra = event.get("extra") or {}
    parts = [
        event.get("event_id"),
        event.get("session_id"),
        event.get("event_type"),
        event.get("seq"),
        event.get("host_id"),
        extra.get("source_kind"),
        extra.get("source_sha256"),
        extra.get("otlp_client"),
    ]
    return "\x1f".join("" if p is None else str(p) for p in parts)


def sign_door(event: dict[str, Any], key: str) -> dict[str, Any]:
    """``event`` as the import or OTLP door admitted it: its identity and place signed with the door key."""
    extra = {**(event.get("extra") or {})}
    extra.pop("door_mac", None)
    event = {**event, "extra": extra}
    return {**event, "extra": {**extra, "door_mac": _mac(key, _door_message(event))}}


def verify_door(event: dict[str, Any], key: str) -> bool:
    """Whether an import/OTLP-door event carries the signature :func:`sign_door` gives it (tests, tools)."""
    given = str((event.get("extra") or {}).get("door_mac") or "")
    return hmac.compare_digest(given, _mac(key, _door_message(event)))


#: :func:`_door_message` in SQL, over a raw-events row.
_DOOR_MESSAGE_SQL = (
    "concat_ws(chr(31), coalesce(event_id, ''), coalesce(session_id, ''), coalesce(event_type, ''),"
    " coalesce(CAST(seq AS VARCHAR), ''), coalesce(host_id, ''), coalesce(extra['source_kind'], ''),"
    " coalesce(extra['source_sha256'], ''), coalesce(extra['otlp_client'], ''))"
)


def set_door_key(con: duckdb.DuckDBPyConnection, home: Path) -> None:
    """Hold the installation's door key in ``con`` for :func:`admit` (assembly calls it once per run)."""
    con.execute(f"SET VARIABLE {KEY_VARIABLE} = $key", {"key": door_key(home)})


# -- at assembly ---------------------------------------------------------------------------------------------


def admit(con: duckdb.DuckDBPyConnection, trusted: tuple[str, ...]) -> list[Quarantined]:
    """Admit ``ev``'s events (one chunk of sessions): every rule of trust, in order; one record per thing set aside.

    Unverified verdicts-door claims leave first, then ownership and precedence decide, then origins are
    checked and token strings searched for secrets.
    """
    records = _verify_verdicts_door(con)
    records += _verify_door_identity(con)
    records += apply_ownership(con, trusted)
    records += _check_origins(con)
    records += _check_token_strings(con)
    return records


def _verify_verdicts_door(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    provenance = "evaluation.provenance" if has_payload_field(con, "evaluation", "provenance") else "NULL::VARCHAR"
    message = _VERDICT_MESSAGE_SQL.replace("{provenance}", provenance)
    key = f"getvariable('{KEY_VARIABLE}')"
    rows = con.execute(
        f"""
        SELECT rowid, session_id, event_id, host_id, event_type FROM ev
        WHERE extra['source_kind'] = '{VERDICTS_DOOR}'
          AND ({key} IS NULL OR extra['door_mac'] IS NULL
               OR extra['door_mac'] <> sha256({key} || chr(31) || sha256({key} || chr(31) || {message})))
        """
    ).fetchall()
    return _exclude_unverified(
        con,
        rows,
        lambda event_type, host_id: (
            f"{event_type} from host {host_id} claims the verdicts door without its signature; only "
            "`trajlake import --verdicts` of this installation speaks for that door"
        ),
    )


def _exclude_unverified(
    con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]], detail: Callable[[str, str], str]
) -> list[Quarantined]:
    """Take ``rows`` (rowid, session, event id, host, event type) out of ``ev``, one ``unverified_door`` record each."""
    if not rows:
        return []
    con.execute("DELETE FROM ev WHERE rowid IN (SELECT unnest($ids::BIGINT[]))", {"ids": [r[0] for r in rows]})
    return [
        Quarantined(session_id, "assemble", "unverified_door", "excluded", detail(event_type, host_id), event_id)
        for _, session_id, event_id, host_id, event_type in rows
    ]


def _verify_door_identity(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    """Events wearing the import or OTLP door's identity without its signature, where that door signed the session.

    The import door (``source_kind = 'import'``, a file's sha256: anyone holding the file knows it) and the
    OTLP door (``otlp_client``) are identities a Kafka host could copy onto its own events. Where the door
    signed its events for a session (:func:`sign_door`), an event claiming the same identity without a valid
    signature is another sender's -- excluded (``unverified_door``) before ownership is decided, whether it
    came before or after the door's. Sessions no door signed (written before doors signed, or by a door run
    without the installation's key) are judged as before.
    """
    key = f"getvariable('{KEY_VARIABLE}')"
    digest = f"sha256({key} || chr(31) || sha256({key} || chr(31) || {_DOOR_MESSAGE_SQL}))"
    signed = f"(extra['door_mac'] IS NOT NULL AND extra['door_mac'] = {digest})"
    rows = con.execute(
        f"""
        WITH claims AS (
            SELECT rowid AS row_id, session_id, event_id, host_id, event_type, {IDENTITY_SQL} AS identity,
                   coalesce({signed}, false) AS signed
            FROM ev
            WHERE {key} IS NOT NULL AND (extra['source_kind'] = 'import' OR extra['otlp_client'] IS NOT NULL)
        ),
        doors AS (SELECT DISTINCT session_id, identity FROM claims WHERE signed)
        SELECT row_id, session_id, event_id, host_id, event_type FROM claims JOIN doors USING (session_id, identity)
        WHERE NOT signed
        """
    ).fetchall()
    return _exclude_unverified(
        con,
        rows,
        lambda event_type, host_id: (
            f"{event_type} from host {host_id} wears the identity of the door that signed this session without "
            "its signature; only that door of this installation speaks for it"
        ),
    )


#: The origin the door an ``ev`` row came through gives it (the declared one only where the door allows it).
DOOR_ORIGIN_SQL = f"""CASE
    WHEN extra['otlp_client'] IS NOT NULL THEN '{OTLP_ORIGIN}'
    WHEN extra['source_kind'] = 'import' THEN
        CASE WHEN regexp_full_match(coalesce(extra['origin'], ''), '{IMPORT_PREFIX}[a-z0-9][a-z0-9._-]{{0,63}}')
             THEN extra['origin'] ELSE '{IMPORT_PREFIX}unknown' END
    WHEN extra['origin'] IN {KAFKA_ORIGINS} THEN extra['origin']
    ELSE 'sdk' END"""


def _check_origins(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    rows = con.execute(
        f"""
        SELECT rowid, session_id, event_id, extra['origin'] AS declared, {DOOR_ORIGIN_SQL} AS door,
               CASE WHEN extra['otlp_client'] IS NOT NULL THEN 'OTLP'
                    WHEN extra['source_kind'] = 'import' THEN 'import' ELSE 'Kafka (host ' || host_id || ')' END
        FROM ev
        WHERE event_type = 'session_start' AND extra['origin'] IS NOT NULL AND extra['origin'] <> {DOOR_ORIGIN_SQL}
        """
    ).fetchall()
    if not rows:
        return []
    for row_id, _, _, declared, origin, _ in rows:
        con.execute(
            "UPDATE ev SET extra = map_concat(extra, MAP {'origin': $origin, 'declared_origin': $declared})"
            " WHERE rowid = $row",
            {"origin": origin, "declared": declared, "row": row_id},
        )
    return [
        _origin_record(session_id, event_id, declared, origin, door, "assemble")
        for _, session_id, event_id, declared, origin, door in rows
    ]


def _check_token_strings(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    if not has_payload_field(con, "agent_input", "completion_tokens_text"):
        return []
    rows = con.execute(
        """
        SELECT session_id, event_id, agent_input.model_call.completion_tokens_text FROM ev
        WHERE event_type = 'agent_input' AND len(agent_input.model_call.completion_tokens_text) > 0
        ORDER BY session_id
        """
    ).fetchall()
    leaking: dict[str, str] = {}
    for session_id, event_id, tokens in rows:
        if session_id not in leaking and redact_tokens(list(tokens), redact_text) is not None:
            leaking[session_id] = event_id
    if not leaking:
        return []
    con.execute("DELETE FROM ev WHERE session_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": list(leaking)})
    detail = (
        "the token strings of a model call spell a secret the producer did not redact; its token ids spell it "
        "too and cannot be redacted, so the session stays out of the lakehouse's tables"
    )
    return [
        Quarantined(session_id, "assemble", "secret_in_token_strings", "skipped", detail, event_id)
        for session_id, event_id in leaking.items()
    ]


def verify_mac(event: dict[str, Any], key: str) -> bool:
    """Whether a verdicts-door event carries the digest :func:`admit_verdict` gives it (tests, tools)."""
    given = str((event.get("extra") or {}).get("door_mac") or "")
    return hmac.compare_digest(given, _mac(key, _verdict_message(event)))
