"""What one ingest run did: counts, detected resets and gaps, and where its time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class IngestTimings:
    """Where an ingest run's time went, phase by phase (``time.perf_counter`` seconds).

    The worker records these itself, so a benchmark reads them instead of hooking into
    the worker. Each field has one writer: the consuming (main) thread, the decode
    thread or the commit thread.
    """

    consume_s: float = 0.0  # polling Kafka and adding the records to the batch
    decode_s: float = 0.0  # decoding batches (mostly waiting for the decoder process)
    commit_s: float = 0.0  # Iceberg commits of raw_events and dead_letters (retries included)
    first_record_at: float | None = None  # when the first record was added to a batch
    last_commit_at: float | None = None  # when the latest batch's commits finished

    @property
    def first_record_to_last_commit_s(self) -> float:
        """Seconds from the first record received to the end of the latest batch commit (0 before any)."""
        if self.first_record_at is None or self.last_commit_at is None:
            return 0.0
        return self.last_commit_at - self.first_record_at


@dataclass
class IngestUpkeep:
    """What a follower's own table upkeep did (``TRAJLAKE_INGEST_FOLLOW_UPKEEP_SECONDS``), summed over its rounds."""

    rounds: int = 0  # rounds that ran
    skipped: int = 0  # rounds skipped: the lifecycle lock was held, or commits kept conflicting
    files_rewritten: int = 0  # small data files compacted away
    files_written: int = 0  # data files the compactions wrote
    snapshots_expired: int = 0
    snapshots_left: int = 0  # raw_events' snapshots after the latest round
    seconds: float = 0.0  # time the rounds took (the commit thread's, between two commits)


@dataclass
class IngestStats:
    """What one ingest run did."""

    events: int = 0
    dead_letters: int = 0
    skipped: int = 0  # records below the recorded offsets (replays, zombies)
    batches: int = 0
    commit_retries: int = 0
    resets: int = 0  # table commits that started a new topic incarnation
    reset_duplicates: int = 0  # re-sent events dropped after a reset (already ingested before it)
    resent_duplicates: int = 0  # records whose event_id was already ingested (recent-id window)
    gaps: int = 0  # partitions whose recorded offset fell below the low watermark (records lost to retention)
    truncations: int = 0  # recorded offset past the high watermark on a broker without topic ids
    reset_details: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    timings: IngestTimings = field(default_factory=IngestTimings)  # not in as_dict(): reports keep their keys
    upkeep: IngestUpkeep = field(default_factory=IngestUpkeep)  # not in as_dict() either

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for printing and asset metadata (the counts; phase timings are in ``timings``)."""
        return {name: value for name, value in self.__dict__.items() if name not in ("timings", "upkeep")}

    def describe_resets(self) -> list[str]:
        """One human line per detected reset or gap."""
        lines: list[str] = []
        for detail in self.reset_details:
            if detail.get("kind") == "truncated":
                lines.append(
                    f"suspected truncation: {detail['topic']} partition {detail['partition']} recorded offset "
                    f"{detail['recorded']} > high watermark {detail['high']}, and the broker gives no topic id "
                    "to confirm a reset; records below the recorded offset will be skipped"
                )
            elif detail.get("kind") == "gap":
                lines.append(
                    f"gap: {detail['topic']} partition {detail['partition']} recorded offset {detail['recorded']} "
                    f"< low watermark {detail['low']} ({detail['low'] - detail['recorded']} records never ingested)"
                )
            else:
                lines.append(
                    f"topic reset: {detail['table']} {detail['topic']} epoch {detail['epoch']} "
                    f"(topic id {detail['previous_topic_id']} -> {detail['topic_id']}; previous offsets "
                    f"{detail['previous_offsets']}); restarted from the beginning of the new topic"
                )
        return lines
