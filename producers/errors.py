"""Errors of the producer SDK and the sandbox fleet."""

from __future__ import annotations

from common.errors import TerminalError, TrajlakeError, TransientError


class ProducerError(TrajlakeError):
    """Base class of producer SDK errors."""


class DeliveryError(ProducerError, TransientError):
    """Events could not be delivered to Kafka (the message lists how many and why)."""


class SpoolFullError(ProducerError, TransientError):
    """The on-disk spool reached its byte limit while Kafka was unreachable: back-pressure."""


class FleetError(TrajlakeError):
    """Base class of sandbox fleet errors."""


class BubblewrapMissing(FleetError, TerminalError):
    """The local backend needs bubblewrap (``bwrap``), which is not installed or cannot create namespaces."""


class SandboxError(FleetError):
    """A sandbox could not be created or did not answer as its executor should."""


class SandboxKilled(SandboxError):
    """The sandbox was killed (reaped at its deadline) before the command answered."""


class SandboxLimitReached(SandboxError):
    """The sandbox reached a limit of its host (``reason``: ``disk_quota``, ``egress_monitor_failed``); its
    session ends there."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ImageConflict(FleetError, TerminalError):
    """An image version already exists with different content (a version's directory is immutable)."""


class TaskRepositoryError(FleetError):
    """The host's git could not make a task workspace a repository (``producers.fleet.tasks.repo``)."""


class NonFiniteNumberError(ProducerError, TerminalError):
    """An event carries NaN or ±infinity where a measurement belongs (refused at emit, never sent)."""


class RedactionError(ProducerError, TerminalError):
    """A value cannot be redacted safely (nested deeper than the redactor walks); it is refused, never sent."""


class AgentSpecError(FleetError, TerminalError):
    """``--agent`` names no built-in policy, ``llm`` or loadable ``module:callable`` / ``file.py:callable``."""


class AgentToolError(FleetError):
    """An agent's tool call was refused or failed (a path outside the workspace, a file that cannot be read)."""


class ModelAPIError(FleetError):
    """The model endpoint answered with an error that retrying does not fix, or kept failing past the retries."""


class ModelConfigError(ModelAPIError, TerminalError):
    """The model endpoint refused the request as configured (401/403: the key; 404: the model name or the path).

    Rerunning the session cannot help: the endpoint, model name, key or token mode has to change.
    """


class TokenModeError(ModelAPIError, TerminalError):
    """Token-in/token-out cannot keep one exact sequence with this server (a template that is not prefix-stable,
    a response without token ids)."""
