"""Property-based: whatever the arrival order, duplication, batching and lateness, assembly equals the clean stream.

Events another producer sends under a session's id are part of the messy stream: they change nothing.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common.settings import Settings
from pipelines.assemble import assemble
from tests.helpers import AS_OF, sample_events, snapshot, write_raw
from warehouse.lakehouse import Lakehouse

CLOSING = ("evaluation", "session_end")
FORGED = ("agent_action", "env_feedback", "evaluation", "session_end")


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    """Sessions, some never ending, and one messy delivery of them."""
    sessions = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 10_000))
    events = sample_events(sessions, seed=seed)
    ids = sorted({e["session_id"] for e in events})
    endless = set(draw(st.lists(st.sampled_from(ids), max_size=2, unique=True)))
    late = set(draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))) - endless
    clean = [e for e in events if not (e["session_id"] in endless and e["event_type"] in CLOSING)]
    # another producer sends events under a session's id (a host or an imported file claiming it): once the
    # owner's first event is in, they must change nothing, whatever the order they arrive in
    victims = draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))
    foreign = [
        {**e, "session_id": victim, "event_id": f"foreign-{victim}-{i}", "host_id": "foreign-host", "seq": e["seq"] + 1}
        for victim in victims
        for i, e in enumerate(x for x in events if x["session_id"] != victim and x["event_type"] in FORGED)
    ]
    return {
        "clean": clean,
        "foreign": foreign,
        "late": late,
        "shuffle_seed": draw(st.integers(0, 2**32 - 1)),
        "duplicate_fraction": draw(st.sampled_from([0.0, 0.1, 0.5])),
        "batches": draw(st.integers(1, 4)),
    }


def deliver(scenario: dict) -> list[list[dict]]:
    """The messy stream: shuffled, partly duplicated, split in batches, with late session tails last."""
    rng = random.Random(scenario["shuffle_seed"])
    clean = scenario["clean"] + scenario["foreign"]
    is_late = [e["session_id"] in scenario["late"] and e["event_type"] in CLOSING for e in clean]
    on_time = [e for e, late in zip(clean, is_late, strict=True) if not late]
    tails = [e for e, late in zip(clean, is_late, strict=True) if late]
    stream = on_time + rng.sample(on_time, int(len(on_time) * scenario["duplicate_fraction"]))
    rng.shuffle(stream)
    # a session belongs to the identity whose event was admitted first: each victim's first event is its own
    for victim in {e["session_id"] for e in scenario["foreign"]}:
        first = next(i for i, e in enumerate(stream) if e["session_id"] == victim)
        own = next(i for i, e in enumerate(stream) if e["session_id"] == victim and e["host_id"] != "foreign-host")
        stream[first], stream[own] = stream[own], stream[first]
    cuts = sorted(rng.sample(range(1, len(stream)), scenario["batches"] - 1)) if len(stream) > 1 else []
    batches = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return batches + ([tails + rng.sample(tails, len(tails) // 2)] if tails else [])


@pytest.mark.slow
@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_messy_delivery_assembles_like_the_clean_ordered_stream(scenario: dict) -> None:
    with tempfile.TemporaryDirectory() as home:
        reference = Settings(home=Path(home) / "clean")
        write_raw(reference, scenario["clean"], batch_size=100_000)
        assemble(Lakehouse.open(reference), as_of=AS_OF)
        expected = snapshot(reference)

        messy = Settings(home=Path(home) / "messy")
        for batch in deliver(scenario):
            write_raw(messy, batch)
            # Assembled after every batch, at a time past the idle timeout: sessions whose
            # tail is still to come are closed as timed out, then amended when it lands.
            assemble(Lakehouse.open(messy), as_of=AS_OF)
        assert snapshot(messy) == expected
