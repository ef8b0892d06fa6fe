"""Synthetic fleet: schema-exact fast encoding, determinism, rates, cheat signatures, labels."""

import io
import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import fastavro
import pytest

from producers.fleet import LabelWriter, ListSink, run_fleet
from producers.fleet.agents import POLICIES
from producers.fleet.synthetic import WRITER_VERSION, SyntheticFleet, ts_varint, varint
from schemas.registry import decode_event, encode_event, get_version

START = 1_750_000_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _stream(n=300, seed=3, reuse=1, cheat_rate=0.3, encode=True):
    return list(SyntheticFleet(start_us=START, template_reuse=reuse).stream(n, seed, cheat_rate, encode=encode))


def test_fast_encoder_is_byte_identical_to_fastavro():
    dicts = _stream(encode=False)
    raw = _stream()
    assert len(dicts) == len(raw) > 1000
    for (_, _, _, event), (_, _, _, value) in zip(dicts, raw, strict=True):
        assert encode_event(event, WRITER_VERSION) == value


def _writer_round_trip(value: bytes) -> bytes:
    """Decode under the writer schema alone (no resolution to the latest) and encode again."""
    schema = get_version(WRITER_VERSION)
    buffer = io.BytesIO(value[len(schema.header) :])
    record = fastavro.schemaless_reader(buffer, schema.parsed, None, return_record_name=True)
    assert buffer.tell() == len(value) - len(schema.header)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema.parsed, record)
    return schema.header + out.getvalue()


@pytest.mark.slow
def test_template_reruns_are_exact_events():
    """Re-runs of pre-encoded sessions (the fast path at scale) decode to what their tuple says and
    re-encode to the same bytes: ids, times, parents and envelope are patched in the right places."""
    events = _stream(n=400, reuse=8)
    sessions = Counter(sid for _, sid, _, _ in events)
    assert len(sessions) == 400
    by_id = {}
    for ts, sid, eid, value in events:
        event = decode_event(value)
        micros = (event["ts"] - EPOCH) // timedelta(microseconds=1)
        assert (event["session_id"], event["event_id"], micros, event["seq"]) == (sid, eid, ts, int(eid[24:], 16))
        assert event["sandbox_id"] == f"sb-{sid[:16]}"
        assert event["parent_event_id"] is None or event["parent_event_id"][:24] == sid[:24]
        assert _writer_round_trip(value) == value
        by_id[eid] = event
    # the generator's causal links: feedback and network requests point at the action they follow
    last_action: dict[str, str] = {}
    linked = 0
    for event in sorted(by_id.values(), key=lambda e: (e["session_id"], e["seq"])):
        if event["event_type"] == "agent_action":
            last_action[event["session_id"]] = event["event_id"]
        if event["event_type"] in ("env_feedback", "network_request"):
            assert event["parent_event_id"] == last_action[event["session_id"]]
            linked += 1
        else:
            assert event["parent_event_id"] is None
    assert linked > 1000


def test_varints():
    for n in (0, 1, 63, 64, 1 << 20, START, START + 123_456_789):
        assert ts_varint(n) == varint(n) or n < (1 << 48)


@pytest.mark.slow
def test_same_seed_same_stream_other_seed_differs():
    assert [v for *_, v in _stream(reuse=4, n=400)] == [v for *_, v in _stream(reuse=4, n=400)]
    assert [v for *_, v in _stream(seed=4)] != [v for *_, v in _stream(seed=3)]


def test_time_order_and_per_session_sequence():
    events = _stream(n=600, reuse=4)
    last: dict[str, int] = {}
    previous_bucket = 0
    for ts, sid, eid, _value in events:
        seq = int(eid[24:], 16)
        assert seq == last.get(sid, -1) + 1
        last[sid] = seq
        assert ts // 1_000_000 >= previous_bucket
        previous_bucket = ts // 1_000_000
    decoded = [decode_event(v) for *_, v in events[::50]]
    assert all(d["event_id"].startswith(d["session_id"][:24]) for d in decoded)


@pytest.mark.slow
def test_rates_lifetimes_and_signatures(settings, tmp_path):
    labels = tmp_path / "labels.jsonl"
    sink = ListSink()
    report = run_fleet(
        settings, "synthetic", 500, seed=1, cheat_rate=0.2, labels_path=labels, sink=sink, start_us=START
    )
    assert report.sessions == 500 and report.events == len(sink.events)
    lines = [json.loads(line) for line in labels.read_text().splitlines()]
    assert len(lines) == 500
    by_session: dict[str, list] = {}
    for event in sink.events:
        by_session.setdefault(event["session_id"], []).append(event)
    starts = sorted(e["ts"] for e in sink.events if e["event_type"] == "session_start")
    span_s = (starts[-1] - starts[0]) / 1e6
    assert 500 / span_s == pytest.approx(35, rel=0.25)  # Poisson at 35/s
    ends = [e for e in sink.events if e["event_type"] == "session_end"]
    runtimes = [e["payload"]["runtime_s"] for e in ends]
    assert min(runtimes) >= 15 and max(runtimes) <= 1300
    steps = Counter(e["session_id"] for e in sink.events if e["event_type"] == "agent_action")
    assert 8 <= sorted(steps.values())[len(steps) // 2] <= 40
    kinds = Counter(e["event_type"] for e in sink.events)
    assert set(kinds) == {
        "session_start",
        "agent_input",
        "agent_action",
        "env_feedback",
        "resource_sample",
        "file_op",
        "network_request",
        "evaluation",
        "session_end",
    }
    cheats = Counter(line["cheat_type"] for line in lines if line["cheat_type"])
    assert sum(cheats.values()) == report.cheaters and 60 <= report.cheaters <= 140
    signatures = Counter()
    for line in lines:
        events = by_session[line["session_id"]]
        if any(e["event_type"] == "network_request" and not e["payload"]["allowed"] for e in events):
            signatures["network"] += 1
        if any(e["event_type"] == "file_op" and e["payload"]["path"].startswith("/eval/hidden") for e in events):
            signatures["hidden_tests"] += 1
        if any(e["event_type"] == "file_op" and "/tests/" in e["payload"]["path"] for e in events):
            signatures["edit_tests"] += 1
        if any(e["event_type"] == "file_op" and e["payload"]["path"].endswith("run_tests.py") for e in events):
            signatures["tamper_runner"] += 1
    for cheat in ("network", "edit_tests", "tamper_runner"):
        assert signatures[cheat] == cheats[cheat], cheat
    assert signatures["hidden_tests"] <= cheats["hidden_tests"]
    timeouts = [e for e in ends if e["payload"]["status"] == "timeout"]
    assert timeouts and all(e["payload"]["exit_reason"] == "reaper" for e in timeouts)


@pytest.mark.slow
def test_labels_never_in_the_stream(settings, tmp_path):
    sink = ListSink()
    run_fleet(
        settings, "synthetic", 200, seed=2, cheat_rate=0.5, sink=sink, labels_path=tmp_path / "l.jsonl", start_us=START
    )
    values = set()
    for event in sink.events:
        values.update(str(v) for k, v in event.items() if k not in ("payload", "extra"))
        values.update(event["extra"])
        values.update(event["extra"].values())
    assert not values & set(POLICIES)
    assert not any("cheat" in v or "expected" in v for v in values)


def test_time_compression_paces_delivery():
    sink = ListSink(decode=False)
    fleet = SyntheticFleet(rate_per_s=35.0, time_compression=600.0, start_us=START)
    report = fleet.run(70, seed=1, cheat_rate=0.1, sink=sink, labels=LabelWriter(None))
    assert report.figures["simulated_span_s"] > 30
    assert report.wall_s >= report.figures["simulated_span_s"] / 600 * 0.9


def test_shards_together_are_the_whole_stream():
    whole = _stream(n=200)
    fleet = SyntheticFleet(start_us=START)
    shards = [list(fleet.stream(200, 3, 0.3, shard=(i, 3))) for i in range(3)]
    assert Counter(map(tuple, whole)) == Counter(map(tuple, (e for shard in shards for e in shard)))
    sessions = [{sid for _, sid, _, _ in shard} for shard in shards]
    assert not (sessions[0] & sessions[1]) and not (sessions[1] & sessions[2])  # a session lives in one shard


def test_synthetic_workers_merge_reports_and_labels(tmp_path):
    from producers.fleet import run_synthetic_workers

    labels = tmp_path / "labels.jsonl"
    report = run_synthetic_workers(None, 60, 5, 0.3, labels, 2, {"start_us": START}, to_kafka=False)
    single = SyntheticFleet(start_us=START)
    expected = sum(1 for _ in single.stream(60, 5, 0.3))
    assert (report.sessions, report.events, report.labels_written) == (60, expected, 60)
    assert sum(report.by_status.values()) == 60 and report.figures["workers"] == 2
    lines = [json.loads(line) for line in labels.read_text().splitlines()]
    assert len({line["session_id"] for line in lines}) == 60
