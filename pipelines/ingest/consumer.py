"""The ingest worker's Kafka consumer settings."""

from __future__ import annotations

from typing import Any

from common.settings import Settings


def consumer_config(settings: Settings, bootstrap: str, follow: bool = False) -> dict[str, Any]:
    """librdkafka consumer settings: manual offsets, fast group join.

    ``follow``: for a consumer that tails the topic for good, next to the producers; it
    refetches politely once its prefetch is full (see below). ``TRAJLAKE_KAFKA_EXTRA`` wins.
    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": settings.consumer_group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Short timeouts make the group join take ~3 s instead of ~23 s on the embedded broker.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": 300_000,
        "fetch.max.bytes": 16 << 20,
        # Fewer, fuller fetches: ~1.6x the consume rate on a backlog, at most 100 ms added latency.
        "fetch.min.bytes": 1 << 20,
        "fetch.wait.max.ms": 100,
        "max.partition.fetch.bytes": 8 << 20,
        # Prefetch bounded well below a batch: a deep backlog must not grow resident memory.
        "queued.max.messages.kbytes": 16 << 10,
        # Once the prefetch above is full, librdkafka waits fetch.queue.backoff.ms before fetching
        # again. Its default (1 s) idles a consumer that drains 16 MB in well under a second, so a
        # backlog is drained with 100 ms (~1.5x the rate). A follower, which tails the topic next to
        # the producers, keeps the default: shorter backoffs made it poll eagerly and slowed the
        # producers of the hour replay, for no gain in freshness.
        **({} if follow else {"fetch.queue.backoff.ms": 100}),
        **settings.kafka_extra,
    }
