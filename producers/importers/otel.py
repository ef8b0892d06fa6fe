"""Import OpenTelemetry GenAI traces: OTLP JSON files (and, through the same mapping, OTLP/HTTP requests).

Input: OTLP ``ExportTraceServiceRequest`` JSON (``{"resourceSpans": …}``), one document or one per
line (the collector's file exporter). Trace and span ids may be hex (the OTLP/JSON encoding) or
base64 (protobuf's JSON mapping). :func:`spans_from_request` reads either that JSON or the
protobuf message, so the receiver (``producers.importers.otlp_receiver``) converts live spans
with exactly this mapping.

A session is one conversation: the spans sharing ``gen_ai.conversation.id``, else one trace.
Spans are read by meaning, in the three conventions instrumented agents use:

====================  ==============================  ================================  ===========================
                      OTel GenAI semantic conventions  OpenLLMetry (Traceloop)           OpenInference
====================  ==============================  ================================  ===========================
model call            ``gen_ai.operation.name`` chat   ``llm.request.type`` chat         span kind ``LLM``
tool call             ``execute_tool``                 ``traceloop.span.kind`` tool      span kind ``TOOL``
agent                 ``invoke_agent``                 ``traceloop.span.kind`` agent     span kind ``AGENT``
messages              ``gen_ai.input/output.messages`` ``gen_ai.prompt/completion.N.*``  ``llm.input/output_messages``
tokens                ``gen_ai.usage.input_tokens``    ``gen_ai.usage.prompt_tokens``    ``llm.token_count.prompt``
tool name / id / io   ``gen_ai.tool.name`` / ``.call`` ``traceloop.entity.*``            ``tool.name``, input/output
====================  ==============================  ================================  ===========================

Each model call span gives an ``agent_input`` (with the ``model_call``: its input messages, its
output message) and an ``agent_action`` per tool call of its output; each tool span gives the
``env_feedback`` of the call with its id (an ``agent_action`` first when no model call named it),
its status and duration. The root span's status ends the session. Event ids derive from span ids,
so a trace sent again (late spans) re-sends the same events.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from producers.importers._common import (
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    arguments_text,
    command_of,
    exit_outcome,
    exit_reason,
    text_of,
)
from producers.importers._source import JsonLines
from producers.importers._values import FieldIssues, count, unix_nanos_micros

FRAMEWORK = "otel"
_MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})


@dataclass
class Span:
    """One span, as the mapping reads it (attributes flattened to plain values)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_us: int | None
    end_us: int | None
    attributes: dict[str, Any]
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``model``, ``tool``, ``agent`` or ``other``, whichever convention the span follows."""
        a = self.attributes
        operation = str(a.get("gen_ai.operation.name") or "").lower()
        inference = str(a.get("openinference.span.kind") or "").upper()
        traceloop = str(a.get("traceloop.span.kind") or "").lower()
        if operation in _MODEL_OPERATIONS or inference == "LLM" or a.get("llm.request.type") in ("chat", "completion"):
            return "model"
        if operation == "execute_tool" or inference == "TOOL" or traceloop == "tool":
            return "tool"
        if operation in ("invoke_agent", "create_agent") or inference == "AGENT" or traceloop in ("agent", "workflow"):
            return "agent"
        return "other"

    def get(self, *keys: str) -> Any:
        """The first of ``keys`` the span has."""
        return next((self.attributes[k] for k in keys if self.attributes.get(k) not in (None, "")), None)


def _hex_id(value: Any, size: int) -> str:
    """A trace/span id as lowercase hex: OTLP/JSON writes hex, protobuf's JSON mapping base64."""
    if isinstance(value, bytes):
        return value.hex()
    text = str(value or "")
    if len(text) == size * 2 and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex() if text else ""
    except (binascii.Error, ValueError):
        return text


def _any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` (JSON) as a plain value."""
    if not isinstance(value, dict):
        return value
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return None
    if "arrayValue" in value:
        return [_any_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in value:
        return {kv.get("key"): _any_value(kv.get("value")) for kv in (value["kvlistValue"] or {}).get("values") or []}
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _attributes(items: Any) -> dict[str, Any]:
    return {str(kv.get("key")): _any_value(kv.get("value")) for kv in items or [] if isinstance(kv, dict)}


def spans_from_json(request: dict[str, Any], issues: FieldIssues) -> Iterator[Span]:
    """The spans of one ``ExportTraceServiceRequest`` in OTLP JSON."""
    for resource_spans in request.get("resourceSpans") or []:
        if not isinstance(resource_spans, dict):
            continue
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
        for scope in resource_spans.get("scopeSpans") or resource_spans.get("instrumentationLibrarySpans") or []:
            for raw in (scope or {}).get("spans") or []:
                if not isinstance(raw, dict):
                    continue
                status = raw.get("status") or {}
                code = status.get("code", 0)
                yield Span(
                    trace_id=_hex_id(raw.get("traceId"), 16),
                    span_id=_hex_id(raw.get("spanId"), 8),
                    parent_span_id=_hex_id(raw.get("parentSpanId"), 8),
                    name=str(raw.get("name") or ""),
                    start_us=unix_nanos_micros(raw.get("startTimeUnixNano"), "span.startTimeUnixNano", issues),
                    end_us=unix_nanos_micros(raw.get("endTimeUnixNano"), "span.endTimeUnixNano", issues),
                    attributes=_attributes(raw.get("attributes")),
                    status_code={"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, code)
                    if not isinstance(code, int)
                    else code,
                    status_message=str(status.get("message") or ""),
                    events=[
                        (str(e.get("name") or ""), _attributes(e.get("attributes")))
                        for e in raw.get("events") or []
                        if isinstance(e, dict)
                    ],
                    resource=resource,
                )


def spans_from_proto(request: Any) -> Iterator[Span]:
    """The spans of a decoded protobuf ``ExportTraceServiceRequest`` (what the OTLP/HTTP receiver gets)."""
    from google.protobuf.json_format import MessageToDict

    issues = FieldIssues()
    yield from spans_from_json(MessageToDict(request), issues)


def conversation_key(span: Span) -> str:
    """What groups spans into one session: the conversation id when the agent sets one, else the trace."""
    conversation = span.get("gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id")
    return f"conversation:{conversation}" if conversation else f"trace:{span.trace_id}"


def group_sessions(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Spans by session key, each list in start order (ties by span id, so the order is deterministic)."""
    sessions: dict[str, list[Span]] = {}
    trace_keys: dict[str, str] = {}
    pending: list[Span] = []
    for span in spans:
        key = conversation_key(span)
        if key.startswith("conversation:"):
            trace_keys[span.trace_id] = key
        pending.append(span)
    for span in pending:  # a span without the conversation id joins its trace's conversation
        key = trace_keys.get(span.trace_id) or conversation_key(span)
        sessions.setdefault(key, []).append(span)
    for own in sessions.values():
        own.sort(key=lambda s: (s.start_us if s.start_us is not None else 0, s.span_id))
    return sessions


# -- messages in the three conventions ----------------------------------------------------------------------


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _semconv_message(message: dict[str, Any]) -> dict[str, Any]:
    """A GenAI semconv message (``role`` + ``parts``) as an OpenAI chat message."""
    role = str(message.get("role") or "user")
    texts, calls, answers = [], [], []
    for part in message.get("parts") or []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(text_of(part.get("content")))
        elif kind == "tool_call":
            calls.append(
                {
                    "id": str(part.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(part.get("name") or ""),
                        "arguments": arguments_text(part.get("arguments")),
                    },
                }
            )
        elif kind == "tool_call_response":
            answers.append((str(part.get("id") or ""), part.get("response")))
        elif kind == "reasoning":
            pass
    if answers:
        call_id, response = answers[0]
        return {
            "role": "tool",
            "tool_call_id": call_id,
            "content": response if isinstance(response, str) else json.dumps(response),
        }
    out: dict[str, Any] = {"role": role, "content": "\n".join(texts) if texts else (message.get("content") or "")}
    reasoning = [
        text_of(p.get("content"))
        for p in message.get("parts") or []
        if isinstance(p, dict) and p.get("type") == "reasoning"
    ]
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _indexed(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``prefix.0.x``, ``prefix.1.x`` … attributes as a list of dicts (nested indices kept as dicts)."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix + "."):
            continue
        rest = key[len(prefix) + 1 :]
        index, _, name = rest.partition(".")
        if index.isdigit() and name:
            items.setdefault(int(index), {})[name] = value
    return [items[i] for i in sorted(items)]


def _indexed_calls(
    flat: dict[str, Any], prefix: str, id_key: str, name_key: str, args_key: str
) -> list[dict[str, Any]]:
    calls = []
    for entry in _indexed(flat, prefix):
        calls.append(
            {
                "id": str(entry.get(id_key) or ""),
                "type": "function",
                "function": {
                    "name": str(entry.get(name_key) or ""),
                    "arguments": arguments_text(_parsed(entry.get(args_key))),
                },
            }
        )
    return calls


def _flat_message(entry: dict[str, Any], style: str) -> dict[str, Any]:
    if style == "openinference":
        out: dict[str, Any] = {
            "role": str(entry.get("message.role") or "user"),
            "content": entry.get("message.content") or "",
        }
        calls = _indexed_calls(
            entry, "message.tool_calls", "tool_call.id", "tool_call.function.name", "tool_call.function.arguments"
        )
        if entry.get("message.tool_call_id"):
            out["tool_call_id"] = str(entry["message.tool_call_id"])
    else:
        out = {"role": str(entry.get("role") or "user"), "content": entry.get("content") or ""}
        calls = _indexed_calls(entry, "tool_calls", "id", "name", "arguments")
        if entry.get("tool_call_id"):
            out["tool_call_id"] = str(entry["tool_call_id"])
    if calls:
        out["tool_calls"] = calls
    return out


def span_messages(span: Span) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """(input messages, output message, finish reason) of a model call span, whichever convention it uses."""
    a = span.attributes
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        inputs = [_semconv_message(m) for m in _parsed(a.get("gen_ai.input.messages")) or [] if isinstance(m, dict)]
        system = _parsed(a.get("gen_ai.system_instructions"))
        if system:
            text = (
                system
                if isinstance(system, str)
                else "\n".join(text_of(p.get("content")) for p in system if isinstance(p, dict))
            )
            inputs.insert(0, {"role": "system", "content": text})
        outputs = [m for m in _parsed(a.get("gen_ai.output.messages")) or [] if isinstance(m, dict)]
        output = _semconv_message(outputs[0]) if outputs else None
        finish = outputs[0].get("finish_reason") if outputs else None
        return inputs, output, str(finish) if finish else None
    if any(k.startswith("llm.input_messages.") for k in a):
        inputs = [_flat_message(m, "openinference") for m in _indexed(a, "llm.input_messages")]
        outputs = [_flat_message(m, "openinference") for m in _indexed(a, "llm.output_messages")]
        return inputs, outputs[0] if outputs else None, None
    if any(k.startswith("gen_ai.prompt.") for k in a):
        inputs = [_flat_message(m, "openllmetry") for m in _indexed(a, "gen_ai.prompt")]
        completions = _indexed(a, "gen_ai.completion")
        output = _flat_message(completions[0], "openllmetry") if completions else None
        finish = completions[0].get("finish_reason") if completions else None
        return inputs, output, str(finish) if finish else None
    events = [(n, e) for n, e in span.events if n.startswith("gen_ai.")]  # the older event-based convention
    inputs = [{"role": n.split(".")[1], "content": e.get("content") or ""} for n, e in events if n != "gen_ai.choice"]
    choice = next((e for n, e in events if n == "gen_ai.choice"), None)
    return inputs, ({"role": "assistant", "content": _parsed(choice.get("message")) or ""} if choice else None), None


# -- the session ------------------------------------------------------------------------------------------


@dataclass
class _Run:
    builder: RunBuilder
    spans: list[Span]
    actions: dict[str, tuple[str, int]] = field(default_factory=dict)  # tool call id -> (action event, time)
    calls: int = 0


def _name_next(builder: RunBuilder, span: Span, role: str) -> None:
    """The next event's id from the span it comes from (a trace sent again re-sends the same ids)."""
    builder.name_next(f"span/{span.span_id}/{role}")


def _on_model_span(run: _Run, span: Span) -> None:
    """A model call: agent_input with the call record, then an agent_action per tool call of its reply."""
    builder, issues = run.builder, run.builder.issues
    inputs, output, finish = span_messages(span)
    builder.calls.extend_to(inputs)
    reply = output or {"role": "assistant", "content": ""}
    usage = {
        "prompt_tokens": count(
            span.get(
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.prompt_tokens",
                "llm.token_count.prompt",
                "llm.usage.prompt_tokens",
            ),
            "usage",
            issues,
        ),
        "completion_tokens": count(
            span.get(
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.token_count.completion",
                "llm.usage.completion_tokens",
            ),
            "usage",
            issues,
        ),
    }
    cached = count(
        span.get(
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.cache_read_input_tokens",
            "llm.token_count.prompt_details.cache_read",
        ),
        "usage",
        issues,
    )
    model = str(span.get("gen_ai.response.model", "gen_ai.request.model", "llm.model_name") or "")
    builder.at(span.start_us)
    record = builder.model_call(
        reply,
        model=model,
        usage={**usage, "prompt_tokens_details": {"cached_tokens": cached}},
        finish_reason=finish,
        response_id=str(span.get("gen_ai.response.id") or span.span_id),
    )
    message_id = f"span-{span.span_id}"
    _name_next(builder, span, "input")
    builder.agent_input(
        prompt_digest=record["request_sha256"],
        input_tokens=usage["prompt_tokens"],
        cached_tokens=cached,
        n_messages=record["n_messages"],
        content=text_of(inputs[-1].get("content")) if run.calls == 0 and inputs else None,
        message_id=message_id,
        model_call=record,
    )
    run.calls += 1
    builder.at(span.end_us)
    latency = (span.end_us - span.start_us) / 1000 if span.end_us and span.start_us else 0.0
    for position, call in enumerate(reply.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        _name_next(builder, span, f"action/{position}")
        action_id = builder.action(
            call["function"]["name"],
            arguments,
            command_of(arguments),
            text_of(reply.get("content")) or None,
            tool_call_id=call["id"],
            message_id=message_id,
            output_tokens=usage["completion_tokens"] if position == 0 else 0,
            model_latency_ms=latency if position == 0 else 0.0,
        )
        run.actions[call["id"]] = (action_id, builder.now)


def _on_tool_span(run: _Run, span: Span) -> None:
    """A tool execution: the env_feedback of its call (its action first, when no model call named it)."""
    builder = run.builder
    call_id = str(span.get("gen_ai.tool.call.id", "tool_call.id", "tool.call.id") or f"span-{span.span_id}")
    name = str(span.get("gen_ai.tool.name", "tool.name", "traceloop.entity.name") or span.name)
    arguments = arguments_text(
        _parsed(span.get("gen_ai.tool.call.arguments", "tool.parameters", "input.value", "traceloop.entity.input"))
    )
    builder.at(span.start_us)
    if call_id not in run.actions:
        _name_next(builder, span, "action")
        action_id = builder.action(name, arguments, command_of(arguments), None, tool_call_id=call_id)
        run.actions[call_id] = (action_id, builder.now)
    action_id, _ = run.actions.pop(call_id)
    result = span.get("gen_ai.tool.call.result", "output.value", "traceloop.entity.output")
    output = result if isinstance(result, str) else json.dumps(result) if result is not None else ""
    builder.at(span.end_us)
    _name_next(builder, span, "feedback")
    builder.feedback(
        action_id,
        output,
        tool_call_id=call_id,
        duration_ms=(span.end_us - span.start_us) / 1000 if span.end_us and span.start_us else 0.0,
        failure_reason=(span.status_message or "error") if span.status_code == 2 else None,
    )
    builder.calls.append({"role": "tool", "tool_call_id": call_id, "content": output})


def _instruction(spans: list[Span]) -> str:
    for span in spans:
        if span.kind == "model":
            inputs, _, _ = span_messages(span)
            user = next((text_of(m.get("content")) for m in inputs if m.get("role") == "user"), None)
            if user:
                return user
    for span in spans:
        if span.kind == "agent":
            value = span.get("gen_ai.input.messages", "input.value", "traceloop.entity.input")
            if value:
                return value if isinstance(value, str) else json.dumps(value)
    return ""


def convert_spans(
    source: SourceFile, key: str, spans: list[Span], issues: FieldIssues | None = None
) -> ImportedSession:
    """One session from the spans of one conversation (in start order).

    Raises:
        ImportFormatError: no model call and no tool call among the spans (not an agent's trace).
    """
    run = _begin(source, key, spans, issues or FieldIssues())
    for span in spans:
        if span.kind == "model":
            _on_model_span(run, span)
        elif span.kind == "tool":
            _on_tool_span(run, span)
    return _end(run, key)


def _root(spans: list[Span]) -> Span:
    """The conversation's root span (the first without a parent, else the first)."""
    return next((s for s in spans if not s.parent_span_id), spans[0])


def _begin(source: SourceFile, key: str, spans: list[Span], issues: FieldIssues) -> _Run:
    """The task, agent and model the spans name, read into a builder started at the first span.

    Raises:
        ImportFormatError: no model call and no tool call among the spans.
    """
    if not any(s.kind in ("model", "tool") for s in spans):
        raise ImportFormatError(source.path, f"{key}: no model call or tool call span (gen_ai.*, llm.*, tool.*)")
    root = _root(spans)
    agent = next((s for s in spans if s.kind == "agent"), root)
    model = next(
        (
            str(s.get("gen_ai.request.model", "llm.model_name"))
            for s in spans
            if s.get("gen_ai.request.model", "llm.model_name")
        ),
        None,
    )
    builder = RunBuilder(
        source,
        FRAMEWORK,
        "otlp-json",
        {
            "task_id": str(
                agent.get("gen_ai.agent.name", "task.id") or root.resource.get("service.name") or root.name or "otel"
            ),
            "task_type": "otel",
            "image_version": str(root.resource.get("telemetry.sdk.version") or "otlp"),
            "agent_name": str(agent.get("gen_ai.agent.name") or root.resource.get("service.name") or "") or None,
            "agent_version": str(root.resource.get("service.version") or "") or None,
            "agent_model": model,
        },
        key=key,
        source_session_id=key.partition(":")[2],
        issues=issues,
    )
    run = _Run(builder, spans)
    builder.at(min((s.start_us for s in spans if s.start_us is not None), default=None))
    builder.name_next(f"{key}/start")
    builder.start(_instruction(spans), task_family=builder.emitter.envelope["task_id"])
    return run


def _end(run: _Run, key: str) -> ImportedSession:
    """The session's end at the last span's end: the root span's status and error, its duration."""
    builder, spans = run.builder, run.spans
    root = _root(spans)
    ends = [s.end_us for s in spans if s.end_us is not None]
    builder.at(max(ends) if ends else None)
    error = root.status_message or next((e.get("exception.message") for n, e in root.events if n == "exception"), None)
    status = "error" if root.status_code == 2 else "completed"
    runtime = (root.end_us - root.start_us) / 1e6 if root.end_us and root.start_us else 0.0
    builder.name_next(f"{key}/end")
    builder.end(
        exit_outcome(status, str(error) if root.status_code == 2 and error else None),
        runtime,
        exit_reason(status, str(error) if error else None),
    )
    return builder.finish()


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is OTLP trace JSON (``resourceSpans``), one document or JSON Lines of them."""
    if isinstance(data, JsonLines):
        return looks_like(data.first)
    return isinstance(data, dict) and isinstance(data.get("resourceSpans"), list)


def why_not(data: Any) -> str:
    """Why ``data`` is not OTLP trace JSON (for the unknown-format message)."""
    return "no 'resourceSpans' (OTLP trace JSON)"


def convert(source: SourceFile) -> list[ImportedSession]:
    """One session per conversation (or trace) of an OTLP JSON document.

    Raises:
        ImportFormatError: no conversation in the document holds a model or tool call.
    """
    issues = FieldIssues()
    return convert_groups(source, group_sessions(spans_from_json(source.data, issues)), issues)


def convert_groups(source: SourceFile, groups: dict[str, list[Span]], issues: FieldIssues) -> list[ImportedSession]:
    """Sessions of grouped spans; a group that is no agent's trace is skipped when others are."""
    sessions, errors = [], []
    for key, spans in groups.items():
        try:
            sessions.append(convert_spans(source, key, spans, FieldIssues(list(issues.items))))
        except ImportFormatError as exc:
            errors.append(exc)
    if not sessions and errors:
        raise errors[0]
    return sessions


def session_uuid(source_sha256: str, key: str) -> str:
    """The session id :func:`convert_spans` gives a conversation (what the receiver keys Kafka by)."""
    from producers.importers._builder import IMPORT_NAMESPACE

    return uuid.uuid5(uuid.uuid5(IMPORT_NAMESPACE, source_sha256), f"{key}/session").hex
