"""The session lifecycle in stages: the same event streams as the one-method sessions it replaced.

The digests were recorded from the fleet before its sessions were split into stages (prepare → run
agent → judge → emit end); a change of what a session emits changes them. Local sessions are
compared through ``stream_digest`` (what differs between two runs of one seed is left out); the
synthetic stream is compared byte for byte.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from producers.fleet import LabelWriter, ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.sandbox import bwrap_available
from producers.fleet.synthetic import SyntheticFleet
from tests.producers.fleet.stream_digest import stream_digest

SCRIPTED_MIX = {
    p: 1.0
    for p in (
        "solver",
        "flailer",
        "guesser",
        "cheat_network",
        "cheat_framework_patch",
        "cheat_edit_tests",
        "cheat_forged_verdict",
    )
}
#: Recorded from the fleet before its sessions were staged (seed 20240, 7 sessions of SCRIPTED_MIX;
#: scripted 28137d8e…, raising 2892e1b4…, capped 02166102…, synthetic 7737a275… and feb1184d…), and
#: the staged lifecycle gave exactly those. Re-recorded since for three deliberate changes, checked
#: by comparing the normalised streams: the task images are version 1.3.0 (their runner's sha256 in
#: ``session_start`` changed with it; the synthetic stream of the old code with the new version
#: gives the synthetic digests below byte for byte), and the forged-verdict session's
#: ``evaluation`` extra names the planted code (``planted_kinds``); and every session's envelope
#: ``extra`` declares its ``origin`` (``sandbox`` / ``synthetic``) and a sandbox session's ``evaluation``
#: extra carries its ``submission`` patch (without those two keys the streams give the previous digests).
SCRIPTED_DIGEST = "e841149874cfb3bf822ad9ca5f1e2a11273d1514fa8ac521a3333ce90464a792"
SCRIPTED_LABELS = "5243ee5358b85df8158a9063e27f9987c8cefef2a0f6ef0429e8fec706b70630"
RAISING_DIGEST = "635de12bfac1c210f8216de2ca30d590a99cd033935e3c52e6f11e207a21ace0"
CAPPED_DIGEST = "00b9fbbed2f317ef8c64d59375d39359353c50c5abad3fe1496e9ba53d37e571"
SYNTHETIC_DIGEST = "1ac81c2d614400ab42372d69eadfdcbe111074764606be47b69db2ff590dd749"
SYNTHETIC_REUSE_DIGEST = "f324d3c299351087a6ef9636123aec1c3459c6cb4b73a7b1281a8a243e454e21"

local = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")


def _labels_digest(text: str) -> str:
    """sha256 of the labels without session ids (random per run), in task order."""
    rows = sorted(
        json.dumps({k: v for k, v in json.loads(line).items() if k != "session_id"}, sort_keys=True)
        for line in text.splitlines()
    )
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def raising_agent(session) -> None:
    """A custom agent with a bug of its own: one command, then an exception."""
    session.run("ls")
    raise RuntimeError("the agent's own bug")


@pytest.mark.slow
@local
def test_scripted_policies_emit_the_recorded_stream(settings, tmp_path):
    sink = ListSink()
    labels = tmp_path / "labels.jsonl"
    run_fleet(
        settings,
        "local",
        7,
        concurrency=2,
        seed=20240,
        sink=sink,
        policy_mix=SCRIPTED_MIX,
        timeout_s=60,
        labels_path=labels,
    )
    digest, sessions = stream_digest(sink.events)
    assert len(sessions) == 7
    assert digest == SCRIPTED_DIGEST
    assert _labels_digest(labels.read_text()) == SCRIPTED_LABELS


@local
def test_a_raising_agent_and_a_capped_policy_emit_the_recorded_stream(settings):
    raised = ListSink()
    run_fleet(settings, "local", 1, seed=31, sink=raised, agent=f"{__name__}:raising_agent", timeout_s=60)
    capped = ListSink()
    run_fleet(settings, "local", 1, seed=32, sink=capped, policy_mix={"solver": 1.0}, caps=Caps(max_steps=3))
    ends = [e["payload"] for e in raised.events + capped.events if e["event_type"] == "session_end"]
    assert [(e["status"], e["exit_reason"]) for e in ends] == [("failed", "agent_raised"), ("capped", "max_steps")]
    assert stream_digest(raised.events)[0] == RAISING_DIGEST
    assert stream_digest(capped.events)[0] == CAPPED_DIGEST


@pytest.mark.parametrize(("reuse", "expected"), [(1.0, "SYNTHETIC_DIGEST"), (4.0, "SYNTHETIC_REUSE_DIGEST")])
def test_synthetic_stream_is_byte_identical(reuse, expected, tmp_path):
    fleet = SyntheticFleet(start_us=1_700_000_000_000_000, template_reuse=reuse)
    digest = hashlib.sha256()
    count = 0
    labels = LabelWriter(tmp_path / "labels.jsonl")
    for ts, session_id, event_id, value in fleet.stream(400, seed=11, cheat_rate=0.2, labels=labels):
        digest.update(f"{ts} {session_id} {event_id} ".encode() + value)
        count += 1
    labels.close()
    digest.update((tmp_path / "labels.jsonl").read_bytes())
    assert count > 5000
    assert digest.hexdigest() == globals()[expected]
