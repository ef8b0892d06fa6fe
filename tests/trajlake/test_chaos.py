"""Chaos against real Apache Kafka: random SIGKILLs of ingest never lose or duplicate an event.

The run itself lives in ``scripts/chaos.py`` (also a command line for bigger trials).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

_spec = importlib.util.spec_from_file_location("chaos", Path(__file__).resolve().parents[2] / "scripts" / "chaos.py")
assert _spec is not None and _spec.loader is not None
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos"] = chaos  # dataclasses resolve their module through sys.modules
_spec.loader.exec_module(chaos)


def assert_exactly_once(result) -> None:
    assert result.lost == 0, result
    assert result.duplicated == 0, result
    assert result.rows == result.distinct_event_ids == result.events, result
    assert result.dead_letters == result.poison, result


def test_20_sigkills_over_100k_events(kafka_server, tmp_path: Path) -> None:
    result = chaos.run_chaos(kafka_server.bootstrap, tmp_path / "home", events=100_000, kills=20, seed=1)
    assert result.kills >= 20
    assert_exactly_once(result)


@pytest.mark.stress
def test_200_sigkills_over_1m_events(kafka_server, tmp_path: Path) -> None:
    result = chaos.run_chaos(
        kafka_server.bootstrap, tmp_path / "home", events=1_000_000, kills=200, seed=2, max_rows=20_000
    )
    assert result.kills >= 200
    assert_exactly_once(result)
