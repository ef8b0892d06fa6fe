"""Errors of the pipeline stages (ingest, assembly, scoring, export)."""

from __future__ import annotations

from common.errors import TerminalError, TrajlakeError


class PipelineError(TrajlakeError):
    """Base class of pipeline-stage errors."""


class ExportError(PipelineError, TerminalError):
    """An export could not be written (bad output path, unknown format, …)."""


class LabelsError(PipelineError, TerminalError):
    """The labels file is missing, unreadable or has no overlap with the scored sessions."""


class RecordError(ExportError):
    """One session's export record cannot be built (too deep, too large, not representable as JSON).

    Attributes:
        reason: a short code for the ``quarantine`` table (``too_deep``, ``too_large``, ``unrepresentable``).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class SessionNotFound(PipelineError, TerminalError):
    """No session, or more than one, matches the id or prefix asked for (``trajlake show``)."""


class ReportError(PipelineError, TerminalError):
    """The report cannot be written (not an export directory, an unreadable export file, a bad output path)."""


class RetryError(PipelineError, TerminalError):
    """The retries cannot run as asked (an LLM session to retry without a model endpoint)."""
