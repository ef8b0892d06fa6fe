"""The admission rules (``pipelines.intake``) under generated interleavings of two identities.

Two identities write events for one session: the session's real host and an intruder (another
host, or the verdicts door). Whatever the interleaving and batching, the session belongs to the
identity whose event was admitted first, the other's events are quarantined with their reason,
and a lower verdict provenance never replaces a higher one. Proven against the real assembly,
through the stored form every door lands in (``write_raw``), and through a real broker (tansu,
then Apache Kafka) for the Kafka door.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.ingest import IngestWorker
from pipelines.intake import PRECEDENCE, outranks, rank
from pipelines.intake.admission import admit_verdict, door_key
from producers.importers._builder import ImportedSession
from producers.importers.otel import Span, spans_from_proto
from producers.importers.otlp_receiver import OtlpReceiver, client_id
from producers.importers.verdicts import PROVENANCES
from producers.sdk import EventProducer
from tests.helpers import AS_OF, sample_events, write_raw
from tests.producers.importers.test_otel_sdk import run_agent
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ROW = (
    "SELECT session_id, host_id, n_events, n_steps, max_seq, status, eval_passed, reward, verdict_provenance "
    "FROM trajectories ORDER BY session_id"
)

_FLEET = sample_events(3, seed=7)
_SID = next(e["session_id"] for e in _FLEET if e["event_type"] == "evaluation" and not e["payload"]["passed"])
OWNER = [e for e in _FLEET if e["session_id"] == _SID]
OWN_EVAL = next(e for e in OWNER if e["event_type"] == "evaluation")


def _lake(home: Path, **overrides: Any) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, **overrides)


def _rows(settings: Settings) -> list[tuple]:
    return run_query(settings, ROW)[1]


def _quarantine(settings: Settings) -> dict[str, tuple[str, str]]:
    _, rows = run_query(settings, "SELECT event_id, reason, action FROM quarantine WHERE stage = 'assemble'")
    return {event_id: (reason, action) for event_id, reason, action in rows}


def _intruder_events(host: str, kinds: list[str], provenance: str | None, passed: bool) -> list[dict]:
    """Another host's events for the session: a forged start (seq 0, all-zero id), steps, a verdict."""
    start = next(e for e in OWNER if e["event_type"] == "session_start")
    action = next(e for e in OWNER if e["event_type"] == "agent_action")
    out: list[dict] = []
    for i, kind in enumerate(kinds):
        if kind == "session_start":
            event = {**start, "event_id": f"{i:032x}" if i else "0" * 32, "seq": 0}
        elif kind == "agent_action":
            event = {**action, "event_id": uuid.UUID(int=100 + i).hex, "seq": i}
        else:
            payload = {**OWN_EVAL["payload"], "passed": passed, "reward": 1.0 if passed else 0.0}
            payload["provenance"] = provenance
            event = {**OWN_EVAL, "event_id": uuid.UUID(int=1000 + i).hex, "seq": i, "payload": payload}
        extra = {"source_kind": "verdicts"} if host == "verdicts" else dict(event.get("extra") or {})
        out.append({**event, "host_id": host, "extra": extra})
    return out


@st.composite
def interleavings(draw: st.DrawFn) -> dict:
    """The owner's session and an intruder's events, merged in a drawn order and cut into drawn batches."""
    host = draw(st.sampled_from(["host-b", "verdicts"]))
    if host == "verdicts":
        kinds = ["evaluation"] * draw(st.integers(1, 2))
    else:
        kinds = draw(st.lists(st.sampled_from(["session_start", "agent_action", "evaluation"]), min_size=1, max_size=4))
    provenance = draw(st.sampled_from([None, *PROVENANCES]))
    intruder = _intruder_events(host, kinds, provenance, passed=draw(st.booleans()))
    picks = draw(st.permutations([0] * len(OWNER) + [1] * len(intruder)))
    queues = [list(OWNER), list(intruder)]
    merged = [queues[p].pop(0) for p in picks]
    cuts = sorted(draw(st.sets(st.integers(1, len(merged) - 1), max_size=3)))
    batches = [merged[a:b] for a, b in zip([0, *cuts], [*cuts, len(merged)], strict=True)]
    return {"host": host, "provenance": provenance, "intruder": intruder, "batches": batches}


def _delivered(lake: Settings, batch: list[dict]) -> list[dict]:
    """``batch`` as its doors send it: the verdicts door signs with the lake's key."""
    key = door_key(lake.home_dir)
    return [admit_verdict(e, key) if e["host_id"] == "verdicts" else e for e in batch]


def _expected_alone(home: Path, events: list[dict]) -> list[tuple]:
    alone = _lake(home)
    write_raw(alone, events)
    assemble(Lakehouse.open(alone), as_of=AS_OF)
    return _rows(alone)


def check_invariants(settings: Settings, case: dict, first: dict, home: Path) -> None:
    """Ownership by arrival and the one precedence, for the lake ``settings`` the case was delivered to."""
    intruder, host = case["intruder"], case["host"]
    # the verdicts door never owns a session its owner's events are in, whichever came first
    owner_is_real = first["host_id"] != host or host == "verdicts"
    owners_events, others = (OWNER, intruder) if owner_is_real else (intruder, OWNER)
    quarantined = _quarantine(settings)
    rows = _rows(settings)
    if host == "verdicts" and owner_is_real:
        # the verdicts door may attach a verdict, never a higher one than the fleet evaluator's
        assert rows == _expected_alone(home, OWNER)
        assert rows[0][6:] == (False, OWN_EVAL["payload"]["reward"], "fleet_evaluator")
        provenance = case["provenance"]
        if provenance in (None, "fleet_evaluator"):
            expected = ("foreign_producer", "excluded")  # no foreign event is the owner's evaluator
        elif provenance == "self_reported":
            expected = ("untrusted_verdict", "not_counted")  # not trusted by default
        else:
            expected = ("lower_verdict", "not_counted")  # trusted, but below the fleet evaluator
        assert all(quarantined[event["event_id"]] == expected for event in intruder)
        return
    # the first admitted identity owns the session: the row is the one its events alone give
    assert rows == _expected_alone(home, owners_events)
    assert rows[0][1] == first["host_id"]
    for event in others:
        reason = "ownership_conflict" if event["event_type"] == "session_start" else "foreign_producer"
        assert quarantined[event["event_id"]] == (reason, "excluded"), event["event_type"]


@pytest.mark.slow
@hypothesis_settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleavings())
def test_every_interleaving_of_two_identities_keeps_the_first_admitted_as_owner(case: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        lake = _lake(home / "lake")
        for batch in case["batches"]:
            write_raw(lake, _delivered(lake, batch))
            assemble(Lakehouse.open(lake), as_of=AS_OF)  # after every batch: an owned session is never reassigned later
        check_invariants(lake, case, case["batches"][0][0], home / "alone")


@pytest.mark.slow
@pytest.mark.integration
def test_every_interleaving_through_the_broker_keeps_the_first_admitted_as_owner(broker: str) -> None:
    """The Kafka door: each identity produces with its own producer; the broker's log order decides."""

    @hypothesis_settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(interleavings())
    def run(case: dict) -> None:
        from common.broker import ensure_topic

        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            suffix = uuid.uuid4().hex[:8]
            lake = load_settings(
                home=home / "lake",
                kafka_bootstrap=broker,
                topic=f"admission-{suffix}",
                consumer_group=f"admission-{suffix}",
            )
            ensure_topic(broker, lake.topic, lake.topic_partitions)
            producers = {
                host: EventProducer(broker, lake.topic, host_id=host, redact=False) for host in ("real", case["host"])
            }
            for batch in case["batches"]:
                for event, sent in zip(batch, _delivered(lake, batch), strict=True):
                    producer = producers[case["host"] if event in case["intruder"] else "real"]
                    producer.emit(sent)
                    producer.flush()  # one at a time: the broker's log order is the drawn order
                IngestWorker(lake).run(until_idle=1)
                assemble(Lakehouse.open(lake), as_of=AS_OF)
            for producer in producers.values():
                producer.close()
            check_invariants(lake, case, case["batches"][0][0], home / "alone")

    run()


def test_the_precedence_is_one_total_order_with_the_fleet_evaluator_on_top() -> None:
    assert rank(None) == rank("fleet_evaluator") > rank("harness_report") == rank("harbor_verifier")
    assert rank("harbor_verifier") > rank("self_reported") > rank("made_up") == 0
    names = [name for level in PRECEDENCE for name in level]
    assert sorted(names) == sorted(PROVENANCES)


@given(st.sampled_from([None, *PROVENANCES, "other"]), st.sampled_from([None, *PROVENANCES, "other"]))
def test_a_lower_provenance_never_replaces_a_higher_one(new: str | None, held: str | None) -> None:
    assert outranks(new, held) == (rank(new) >= rank(held))
    if outranks(new, held) and outranks(held, new):
        assert rank(new) == rank(held)


# -- the OTLP door: a conversation belongs to the client credential that opened it ------------------------


def _agent_spans(conversation: str) -> list[Span]:
    """One run of a real-SDK instrumented agent (fresh trace and span ids each time), root span last."""
    memory = InMemorySpanExporter()
    run_agent(memory, conversation)
    return list(spans_from_proto(encode_spans(memory.get_finished_spans())))


def _assemble_sent(home: Path, sessions: list[ImportedSession]) -> Settings:
    """Assembly of what the receiver sent, each session admitted in the order it was sent."""
    lake = _lake(home)
    for session in sessions:
        write_raw(lake, session.events)
    assemble(Lakehouse.open(lake), as_of=AS_OF)
    return lake


@st.composite
def posts(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Two clients each posting their spans of one conversation in chunks: (client, start, end), interleaved."""
    chunks: list[list[tuple[str, int, int]]] = []
    for client in ("client-a", "client-b"):
        cuts = sorted(draw(st.sets(st.integers(1, 4), max_size=2)))
        chunks.append([(client, a, b) for a, b in zip([0, *cuts], [*cuts, 5], strict=True)])
    picks = draw(st.permutations([0] * len(chunks[0]) + [1] * len(chunks[1])))
    return [chunks[p].pop(0) for p in picks]


@pytest.mark.slow
@hypothesis_settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(posts())
def test_a_second_client_posting_under_a_conversation_id_never_adds_steps(schedule: list) -> None:
    spans = {client: _agent_spans("conv-shared") for client in ("client-a", "client-b")}
    assert all(len(s) == 5 and not s[-1].parent_span_id for s in spans.values())  # the root (with the id) last
    sent: list[ImportedSession] = []
    with OtlpReceiver(sent.append, port=0, settle_s=3600, idle_s=3600) as receiver:
        for client, start, end in schedule:
            receiver.receive(spans[client][start:end], client)
        receiver.flush(everything=True)
    opener = next(client for client, _, end in schedule if end == 5)  # the first to post the conversation id
    other = "client-b" if opener == "client-a" else "client-a"
    assert [s.events[0]["extra"]["otlp_client"] for s in sent] == [opener, other]
    assert receiver.foreign_spans >= 1
    with tempfile.TemporaryDirectory() as tmp:
        lake = _assemble_sent(Path(tmp) / "lake", sent)
        alone = _assemble_sent(Path(tmp) / "alone", sent[:1])
        assert _rows(lake) == _rows(alone) and _rows(lake)[0][3] == 2  # the opener's two steps, no more
        quarantined = _quarantine(lake)
        assert {e["event_id"] for e in sent[1].events} == set(quarantined)
        assert {reason for reason, _ in quarantined.values()} <= {"foreign_producer", "ownership_conflict"}


@pytest.mark.slow
def test_over_http_the_credential_decides_who_owns_a_conversation(tmp_path: Path) -> None:
    sent: list[ImportedSession] = []
    with OtlpReceiver(sent.append, port=0, settle_s=0.2) as receiver:
        for token in ("alpha", "beta"):
            exporter = OTLPSpanExporter(endpoint=receiver.endpoint, headers={"Authorization": f"Bearer {token}"})
            run_agent(exporter, "conv-http")
        deadline = time.monotonic() + 20
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    clients = [s.events[0]["extra"]["otlp_client"] for s in sent]
    assert clients == [client_id("Bearer alpha"), client_id("Bearer beta")] and "alpha" not in clients[0]
    assert sent[0].session_id == sent[1].session_id  # one conversation id: the conflict reaches admission
    lake = _assemble_sent(tmp_path / "lake", sent)
    assert _rows(lake)[0][3] == 2 and set(_quarantine(lake)) == {e["event_id"] for e in sent[1].events}


@given(
    token=st.sampled_from(
        ["gh" + "p_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5", "sk-" + "proj-Zx81Lq0PwN4mB7vC2kJ9hG5fD3sA1qW6eR8tY0uI"]
    ),
    where=st.sampled_from(["instance", "file"]),
)
@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_quarantine_row_keeps_no_secret_its_input_named(
    tmp_path_factory: pytest.TempPathFactory, token: str, where: str
) -> None:
    """The probe: a verdict keyed by a token, a report or run file named after one -- the quarantine rows quote
    the instance id and the path ('verdict:<id>', 'file:<path>', the detail) and kept them verbatim."""
    from pipelines.intake.importing import ImportRun
    from pipelines.intake.quarantine import quarantine_rows
    from pipelines.intake.verdicts import Attached
    from producers.importers import import_paths
    from producers.importers.verdicts import read_verdicts

    tmp = tmp_path_factory.mktemp("q")
    if where == "instance":
        path = tmp / "report.json"
        path.write_text(json.dumps({"resolved_ids": [token]}))
        found, _ = read_verdicts(path)
        records = Attached(unknown=list(found[0].verdicts.values())).quarantine_records()
    else:
        (tmp / f"{token}.json").write_text('{"instance_id": "x", "history": [\n')
        run = ImportRun(report=import_paths([tmp]))
        records = run.quarantine_records()
    assert records
    rows = quarantine_rows(records, "run-1").to_pylist()
    assert token[6:] not in json.dumps(rows, default=str), rows
    assert all(r["reason"] and r["session_id"] for r in rows)
