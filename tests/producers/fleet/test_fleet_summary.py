"""The fleet's summary is a small table that keeps "finished" (how a session ended) apart from "passed
evaluation" (the verdict), and says that the cheaters were planted."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from producers.fleet.report import FleetReport

STATUSES = ["completed", "timeout", "gave_up", "error", "capped", "some_new_status"]
LATENCIES = [f"{n}_{s}" for n in ("first_command", "sandbox_ready", "session") for s in ("p50", "p95", "max")]


def _report(by_status: dict[str, int], passed: int, cheaters: int, latency: dict[str, float]) -> FleetReport:
    return FleetReport(
        "local",
        sum(by_status.values()),
        events=10 * sum(by_status.values()),
        wall_s=12.5,
        by_status=by_status,
        cheaters=cheaters,
        eval_passed=passed,
        latency_ms=latency,
    )


def test_a_run_reads_as_a_table() -> None:
    latency = {"session_p50": 4000.0, "session_p95": 9000.4, "session_max": 12000.0, "sandbox_ready_p50": 50.0}
    text = _report({"completed": 6, "timeout": 2}, passed=3, cheaters=2, latency=latency).summary()
    lines = text.splitlines()
    assert lines[0] == "fleet[local]: 8 sessions, 80 events in 12.5 s (38.4 sessions/min)"
    assert re.search(r"^    finished +6  status completed", text, re.M)
    assert re.search(r"^    timed out +2  status timeout$", text, re.M)
    assert re.search(r"^  passed evaluation +3 of 8  the evaluator's verdict$", text, re.M)
    assert re.search(r"^  planted cheaters +2  run on purpose \(--cheat-rate\)$", text, re.M)
    assert re.search(r"^  latency \(ms\) +p50 +p95 +max$", text, re.M)
    assert re.search(r"^    session +4000 +9000 +12000$", text, re.M)
    assert re.search(r"^    sandbox ready +50$", text, re.M)  # a missing figure leaves its cell empty
    assert "=" not in text and "{" not in text  # no key=value or dict dumps


@given(
    st.dictionaries(st.sampled_from(STATUSES), st.integers(1, 10**6), min_size=1),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.dictionaries(
        st.sampled_from(LATENCIES),
        st.floats(0, 10**7, allow_nan=False),
    ),
)
def test_every_count_is_on_its_labelled_row_within_80_columns(
    by_status: dict[str, int], passed: int, cheaters: int, latency: dict[str, float]
) -> None:
    text = _report(by_status, passed, cheaters, latency).summary()
    assert all(len(line) <= 80 for line in text.splitlines()[1:]), text
    labels = {"completed": "finished", "timeout": "timed out", "gave_up": "gave up"}
    for status, count in by_status.items():
        label = labels.get(status, status.replace("_", " "))
        assert re.search(rf"^    {re.escape(label)} +{count}  status {status}", text, re.M), (status, text)
    assert re.search(rf"^  passed evaluation +{passed} of {sum(by_status.values())}  ", text, re.M)
    assert re.search(rf"^  planted cheaters +{cheaters}  ", text, re.M)
