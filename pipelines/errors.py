"""Errors of the pipeline stages (broker, ingest, assembly, export, CLI)."""

from __future__ import annotations


class TrajlakeError(Exception):
    """Base class of errors the CLI reports as one red line and exit code 1."""


class TransientError(TrajlakeError):
    """Marker: retrying later may succeed (broker unreachable, commit conflict)."""


class TerminalError(TrajlakeError):
    """Marker: retrying will not help until something is changed."""


class BrokerError(TerminalError):
    """The embedded broker could not be started, found or stopped."""


class BrokerNotRunning(BrokerError):
    """No embedded broker is running and no ``TRAJLAKE_KAFKA_BOOTSTRAP`` is set."""


class KafkaUnavailable(TransientError):
    """Kafka did not answer within the timeout."""


class OffsetsMismatch(TrajlakeError):
    """Offsets recorded in Iceberg do not exist in Kafka (topic deleted, recreated or truncated)."""


class CommitConflict(TransientError):
    """An Iceberg commit lost a race with another writer after all retries."""


class ExportError(TerminalError):
    """An export could not be written (bad output path, unknown format, …)."""
