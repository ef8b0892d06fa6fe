"""Typed views of the event schema: a ``TypedDict`` for the envelope and for each payload kind.

These mirror the newest ``schemas/avro/trajlake.event.v*.avsc`` field for field (a test fails
when they drift): a field with an Avro default is ``NotRequired`` (the encoder fills the default),
a union with ``null`` is ``X | None``. Producers and importers build payloads through them so a
misspelt or mistyped field is a type error, not a dead letter.

The event as a whole stays a plain ``dict`` at run time (``producers.sdk.Event``); ``Event`` here
is its static shape, and :data:`PAYLOADS` names the ``TypedDict`` of each ``event_type``.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

Source = Literal["agent", "environment", "system", "evaluator"]


class Envelope(TypedDict):
    """Fields every event carries (the Kafka key is ``session_id``)."""

    event_id: str
    session_id: str
    seq: int
    ts: int
    event_type: str
    source: Source
    sandbox_id: str
    task_id: str
    task_type: str
    host_id: str
    image_name: str
    image_version: str
    agent_name: NotRequired[str | None]
    agent_version: NotRequired[str | None]
    agent_model: NotRequired[str | None]
    policy_version: NotRequired[str | None]
    agent_message_id: NotRequired[str | None]
    parent_event_id: NotRequired[str | None]
    extra: NotRequired[dict[str, str]]
    trace_id: NotRequired[str | None]
    group_id: NotRequired[str | None]
    attempt: NotRequired[int | None]
    retry_of: NotRequired[str | None]


class SessionStart(TypedDict):
    """``session_start``: limits, config digest, egress allowlist, task statement."""

    attempt: NotRequired[int]
    cpu_limit: float
    memory_limit_bytes: int
    pids_limit: int
    timeout_s: float
    network_enabled: bool
    egress_allowlist: NotRequired[list[str]]
    config_digest: str
    instruction: NotRequired[str | None]


class ContentBlob(TypedDict):
    """One content-addressed text of a model call (message or tool list)."""

    sha256: str
    text: str


class ModelCall(TypedDict):
    """One chat-completions call: the request as a delta of content refs, the reply, usage, token ids."""

    call_index: int
    model: str
    response_model: NotRequired[str | None]
    response_id: NotRequired[str | None]
    sampling_params: str
    tools_sha256: NotRequired[str | None]
    prefix_messages: int
    new_messages: list[str]
    request_sha256: str
    n_messages: int
    blobs: list[ContentBlob]
    status: str
    try_index: NotRequired[int]
    http_status: NotRequired[int | None]
    error: NotRequired[str | None]
    finish_reason: NotRequired[str | None]
    response_message_sha256: NotRequired[str | None]
    prompt_tokens: NotRequired[int | None]
    completion_tokens: NotRequired[int | None]
    cached_tokens: NotRequired[int | None]
    reasoning_tokens: NotRequired[int | None]
    latency_ms: float
    cost_usd: NotRequired[float | None]
    prompt_token_ids_shared: NotRequired[int | None]
    prompt_token_ids: NotRequired[list[int]]
    completion_token_ids: NotRequired[list[int]]
    completion_logprobs: NotRequired[list[float]]
    completion_tokens_text: NotRequired[list[str]]
    token_mode: NotRequired[str | None]
    engine: NotRequired[str | None]
    record_level: NotRequired[str | None]


class AgentInput(TypedDict):
    """``agent_input``: what the model was given (digest, token counts, the recorded call)."""

    prompt_digest: str
    input_tokens: int
    cached_tokens: NotRequired[int]
    n_messages: NotRequired[int]
    content: NotRequired[str | None]
    model_call: NotRequired[ModelCall | None]


class AgentAction(TypedDict):
    """``agent_action``: one tool call."""

    tool_name: str
    tool_call_id: str
    arguments: str
    command: NotRequired[str | None]
    thought: NotRequired[str | None]
    output_tokens: int
    reasoning_tokens: NotRequired[int]
    cost_usd: NotRequired[float]
    model_latency_ms: NotRequired[float]
    finish_reason: NotRequired[str | None]


class OutputRef(TypedDict):
    """Where the whole of a cut output is (size and sha256 of the whole)."""

    uri: str
    size_bytes: int
    sha256: str


class EnvFeedback(TypedDict):
    """``env_feedback``: the environment's answer to an action."""

    tool_call_id: str
    output: str
    exit_code: NotRequired[int | None]
    duration_ms: float
    truncated: NotRequired[bool]
    output_bytes: int
    failure_reason: NotRequired[str | None]
    output_ref: NotRequired[OutputRef | None]


class ResourceSample(TypedDict):
    """``resource_sample``: one reading of the sandbox's resources."""

    cpu_seconds: float
    memory_bytes: int
    processes: int
    disk_write_bytes: int
    network_requests: NotRequired[int]


class FileOp(TypedDict):
    """``file_op``: a file the sandbox saw written, created, deleted, …"""

    op: str
    path: str
    size_bytes: NotRequired[int]
    sha256: NotRequired[str | None]
    in_workspace: NotRequired[bool]


class NetworkRequest(TypedDict):
    """``network_request``: an egress attempt."""

    host: str
    port: int
    protocol: NotRequired[str]
    allowed: bool
    bytes_sent: NotRequired[int]
    error: NotRequired[str | None]


class Evaluation(TypedDict):
    """``evaluation``: a verdict on the session and who stands behind it (``provenance``, v4)."""

    passed: bool
    tests_total: int
    tests_passed: int
    reward: float
    fresh_sandbox: bool
    evaluator: str
    duration_ms: float
    details: NotRequired[str | None]
    provenance: NotRequired[str | None]


class SessionEnd(TypedDict):
    """``session_end``: final status, reward, runtime, peaks."""

    status: str
    reward: NotRequired[float | None]
    runtime_s: float
    exit_reason: NotRequired[str | None]
    cpu_seconds: NotRequired[float]
    peak_memory_bytes: NotRequired[int]
    peak_processes: NotRequired[int]
    disk_write_bytes: NotRequired[int]


class Annotation(TypedDict):
    """``annotation``: a label on the session, or (v4, ``part_*`` set) one part of a text too large for one event."""

    key: str
    value: str
    author: NotRequired[str | None]
    part_of_field: NotRequired[str | None]
    part_index: NotRequired[int | None]
    part_count: NotRequired[int | None]
    whole_sha256: NotRequired[str | None]


Payload = (
    SessionStart
    | AgentInput
    | AgentAction
    | EnvFeedback
    | ResourceSample
    | FileOp
    | NetworkRequest
    | Evaluation
    | SessionEnd
    | Annotation
)


class Event(Envelope):
    """One event: the envelope and the payload of the kind ``event_type`` names."""

    payload: Payload


#: ``event_type`` → the payload's ``TypedDict`` (the Avro record of the same name in snake case).
PAYLOADS: dict[str, type] = {
    "session_start": SessionStart,
    "agent_input": AgentInput,
    "agent_action": AgentAction,
    "env_feedback": EnvFeedback,
    "resource_sample": ResourceSample,
    "file_op": FileOp,
    "network_request": NetworkRequest,
    "evaluation": Evaluation,
    "session_end": SessionEnd,
    "annotation": Annotation,
}

#: Nested records by their Avro name (what the drift test follows into).
RECORDS: dict[str, type] = {"ModelCall": ModelCall, "ContentBlob": ContentBlob, "OutputRef": OutputRef}

__all__ = [
    "PAYLOADS",
    "RECORDS",
    "AgentAction",
    "AgentInput",
    "Annotation",
    "ContentBlob",
    "EnvFeedback",
    "Envelope",
    "Evaluation",
    "Event",
    "FileOp",
    "ModelCall",
    "NetworkRequest",
    "OutputRef",
    "Payload",
    "ResourceSample",
    "SessionEnd",
    "SessionStart",
    "Source",
]
