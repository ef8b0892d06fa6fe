"""``trajlake broker stop`` refuses while the embedded broker holds events the lakehouse does not (its storage is in
memory), counting past tansu's lagging high watermark; ``--force`` stops it anyway and says what was dropped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def trajlake(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def produce(bootstrap: str, topic: str, n: int) -> None:
    """``n`` records to partition 0 in one batch (tansu's watermark then moves by one, not by ``n``)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500})
    for i in range(n):
        producer.produce(topic, value=b"not an event %d" % i, key=b"s", partition=0)
    assert producer.flush(30) == 0


def watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermark-probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1])
    finally:
        consumer.close()


def test_stop_refuses_until_everything_is_ingested_and_force_says_what_it_drops(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_HOME=str(tmp_path / "home"), TRAJLAKE_TOPIC="stop-check", TRAJLAKE_TOPIC_PARTITIONS="2")
    started = trajlake("broker", "start", env=env)
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip()
    try:
        assert trajlake("broker", "stop", env=env).stdout.strip() == "stopped"  # an empty topic: nothing to lose
        bootstrap = trajlake("broker", "start", env=env).stdout.strip()

        produce(bootstrap, "stop-check", 20)
        refused = trajlake("broker", "stop", env=env)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert "20 events in topic stop-check are not in the lakehouse yet (partition 0: 20)" in line, line
        assert "--force" in line and "trajlake ingest" in line
        assert trajlake("broker", "status", env=env).returncode == 0  # still running, nothing lost
        # the count is past the watermark: tansu reports the batch's base offset + 1 (real Kafka would say 20)
        print("high watermark after one batch of 20:", watermark(bootstrap, "stop-check"))

        ingested = trajlake("ingest", "--until-idle", "3", env={**env, "TRAJLAKE_KAFKA_BOOTSTRAP": bootstrap})
        assert ingested.returncode == 0, ingested.stderr
        dead = trajlake("sql", "select count(*) n from dead_letters", "--format", "json", env=env)
        assert json.loads(dead.stdout)[0]["n"] == 20  # not events: every one is a dead letter, in the lakehouse

        produce(bootstrap, "stop-check", 7)
        assert "7 events" in trajlake("broker", "stop", env=env).stderr  # only what came after the ingest
        forced = trajlake("broker", "stop", "--force", env=env)
        assert forced.returncode == 0 and forced.stdout.strip() == "stopped", forced.stderr
        assert re.search(r"dropping 7 events in topic stop-check", forced.stderr), forced.stderr
        assert trajlake("broker", "status", env=env).returncode == 1
    finally:
        trajlake("broker", "stop", "--force", env=env)
