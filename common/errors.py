"""The one error tree: every error trajlake raises on purpose derives from :class:`TrajlakeError`.

Each package keeps its branch in its own ``errors`` module (``schemas.errors``,
``producers.errors``, ``warehouse.errors``, ``pipelines.errors``), rooted here. Two markers
say what a caller should do: a :class:`TransientError` may succeed when retried unchanged
(Dagster retries such asset failures; the CLI exits with :data:`EXIT_TRANSIENT`), a
:class:`TerminalError` will not until something is changed. The CLI catches only the root
and prints one red line.
"""

from __future__ import annotations

#: Exit code of the CLI for a transient failure (``EX_TEMPFAIL``: try again later).
EXIT_TRANSIENT = 75
#: Exit code of the CLI for every other trajlake error.
EXIT_ERROR = 1


class TrajlakeError(Exception):
    """Root of every trajlake error; the CLI reports it as one red line."""


class TransientError(TrajlakeError):
    """Marker: retrying later, unchanged, may succeed (broker unreachable, commit conflict)."""


class TerminalError(TrajlakeError):
    """Marker: retrying will not help until something is changed."""


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is marked transient."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, TransientError):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


class ConfigError(TerminalError):
    """A setting is invalid (a ``TRAJLAKE_*`` variable, or ``TRAJLAKE_HOME`` that is not a directory)."""


class BrokerError(TerminalError):
    """The embedded broker could not be started, found or stopped."""


class BrokerNotRunning(BrokerError):
    """No embedded broker is running and no ``TRAJLAKE_KAFKA_BOOTSTRAP`` is set."""


class KafkaUnavailable(TransientError):
    """Kafka did not answer within the timeout."""
