"""Errors of the producer SDK and the sandbox fleet."""

from __future__ import annotations


class ProducerError(Exception):
    """Base class of producer SDK errors."""


class DeliveryError(ProducerError):
    """Events could not be delivered to Kafka (the message lists how many and why)."""


class SpoolFullError(ProducerError):
    """The on-disk spool reached its byte limit while Kafka was unreachable: back-pressure."""


class FleetError(Exception):
    """Base class of sandbox fleet errors."""


class SandboxUnavailable(FleetError):
    """The sandbox runtime (bubblewrap) is missing or cannot create namespaces here."""
