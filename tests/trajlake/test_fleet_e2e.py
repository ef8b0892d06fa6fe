"""Fleet → Kafka → ingest → assemble: 40 local sessions become 40 evaluated trajectories."""

import json

import pytest

from producers.fleet import run_fleet
from producers.fleet.sandbox import bwrap_available
from warehouse.lakehouse import Lakehouse

pytestmark = [
    pytest.mark.integration,
    pytest.mark.e2e,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]


def test_local_fleet_40_sessions_end_to_end(kafka_settings, tmp_path):
    from pipelines.assemble import assemble
    from pipelines.ingest import run_ingest
    from warehouse.query import run_query

    labels = tmp_path / "labels.jsonl"
    report = run_fleet(
        kafka_settings, "local", 40, concurrency=4, seed=0, cheat_rate=0.2, labels_path=labels, timeout_s=10
    )
    assert report.sessions == 40 and report.reaper_survivors == 0
    assert len(labels.read_text().splitlines()) == 40
    run_ingest(kafka_settings, until_idle=5.0)
    assemble(Lakehouse.open(kafka_settings))
    _, rows = run_query(
        kafka_settings,
        "SELECT session_id, status, eval_passed, tests_total FROM trajectories",
    )
    assert len(rows) == 40
    assert all(row[2] is not None and row[3] for row in rows)
    truth = {json.loads(line)["session_id"]: json.loads(line) for line in labels.read_text().splitlines()}
    assert {row[0] for row in rows} == set(truth)
    for session_id, status, passed, _ in rows:
        expected = truth[session_id]["expected_outcome"]
        assert (status == "timeout") == (expected == "timeout")
        if expected != "timeout":
            verdict = run_query(
                kafka_settings,
                "SELECT evaluation.details FROM events WHERE event_type = 'evaluation' "
                f"AND session_id = '{session_id}'",
            )[1]
            assert passed == (expected == "pass"), (truth[session_id], verdict)
