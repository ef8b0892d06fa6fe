"""Traces from a real OpenTelemetry SDK: written as OTLP JSON and imported, and sent live to the OTLP/HTTP receiver."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from producers.importers import import_file
from producers.importers._builder import ImportedSession
from producers.importers.otlp_receiver import OtlpReceiver

QUESTION = "Which of /etc/hosts and /etc/passwd is longer?"


def _tool(name: str, arguments: dict) -> str:
    """What the instrumented agent's tools answer."""
    return {"/etc/hosts": "12", "/etc/passwd": "40"}[arguments["path"]] if name == "count_lines" else "?"


def run_agent(exporter: SpanExporter, conversation: str) -> None:
    """A tool-using agent instrumented by hand with the GenAI semantic conventions, on a real SDK."""
    provider = TracerProvider(resource=Resource.create({"service.name": "line-counter", "service.version": "1.2"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("line-counter.agent")
    system = {"role": "system", "parts": [{"type": "text", "content": "Answer with the tools."}]}
    user = {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
    calls = [("call_1", "/etc/hosts"), ("call_2", "/etc/passwd")]
    request = {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": i, "name": "count_lines", "arguments": {"path": p}} for i, p in calls],
    }
    agent_attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "line-counter"}
    with tracer.start_as_current_span("invoke_agent line-counter", attributes=agent_attributes) as agent:
        agent.set_attribute("gen_ai.conversation.id", conversation)
        with tracer.start_as_current_span("chat gpt-4.1") as chat:
            chat.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4.1",
                    "gen_ai.usage.input_tokens": 57,
                    "gen_ai.usage.output_tokens": 31,
                    "gen_ai.input.messages": json.dumps([system, user]),
                    "gen_ai.output.messages": json.dumps([{**request, "finish_reason": "tool_call"}]),
                }
            )
        answers = []
        for call_id, path in calls:
            with tracer.start_as_current_span(f"execute_tool count_lines {path}") as tool:
                result = _tool("count_lines", {"path": path})
                answers.append(
                    {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]}
                )
                tool.set_attributes(
                    {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "count_lines",
                        "gen_ai.tool.call.id": call_id,
                        "gen_ai.tool.call.arguments": json.dumps({"path": path}),
                        "gen_ai.tool.call.result": result,
                    }
                )
                tool.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("chat gpt-4.1") as chat:
            answer = {"role": "assistant", "parts": [{"type": "text", "content": "/etc/passwd (40 lines)."}]}
            chat.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4.1",
                    "gen_ai.usage.input_tokens": 120,
                    "gen_ai.usage.output_tokens": 9,
                    "gen_ai.input.messages": json.dumps([system, user, request, *answers]),
                    "gen_ai.output.messages": json.dumps([{**answer, "finish_reason": "stop"}]),
                }
            )
    provider.shutdown()


def _check(session: ImportedSession) -> None:
    events = session.events
    assert events[0]["payload"]["instruction"] == QUESTION and events[0]["agent_name"] == "line-counter"
    inputs = [e["payload"] for e in events if e["event_type"] == "agent_input"]
    assert [i["input_tokens"] for i in inputs] == [57, 120] and all(i["model_call"] for i in inputs)
    actions = [e["payload"] for e in events if e["event_type"] == "agent_action"]
    assert [(a["tool_name"], json.loads(a["arguments"])["path"]) for a in actions] == [
        ("count_lines", "/etc/hosts"),
        ("count_lines", "/etc/passwd"),
    ]
    assert actions[0]["output_tokens"] == 31
    assert [e["payload"]["output"] for e in events if e["event_type"] == "env_feedback"] == ["12", "40"]
    assert events[-1]["event_type"] == "session_end" and events[-1]["payload"]["status"] == "completed"


def test_a_real_sdk_trace_written_as_otlp_json_imports_as_one_session(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    run_agent(memory, "conv-file")
    request = encode_spans(memory.get_finished_spans())  # the SDK's own OTLP encoding
    path = tmp_path / "trace.json"
    path.write_text(MessageToJson(request))  # protobuf's JSON mapping: ids in base64
    (session,) = import_file(path).sessions
    _check(session)
    lines = tmp_path / "traces.jsonl"  # the collector's file exporter: one request per line
    lines.write_text(json.dumps(json.loads(path.read_text()), separators=(",", ":")) + "\n" + "{}\n")
    assert [s.steps for s in import_file(lines).sessions] == [2]


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_otlp_http_receiver_turns_live_spans_into_the_same_session() -> None:
    received: list[ImportedSession] = []
    with OtlpReceiver(received.append, port=0, settle_s=0.3) as receiver:
        run_agent(OTLPSpanExporter(endpoint=receiver.endpoint), "conv-live")
        _wait(lambda: len(received) == 1)
        assert receiver.spans_received == 5 and not receiver.errors  # the agent, two model calls, two tools
    (session,) = received
    _check(session)
    assert session.events[0]["extra"]["source_session_id"] == "conv-live"
    memory = InMemorySpanExporter()
    run_agent(memory, "conv-live")
    path_events = import_file_from_spans(memory)
    assert [e["event_type"] for e in session.events] == [e["event_type"] for e in path_events]


def import_file_from_spans(memory: InMemorySpanExporter) -> list[dict]:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "t.json"
        path.write_text(MessageToJson(encode_spans(memory.get_finished_spans())))
        (session,) = import_file(path).sessions
        return session.events


def test_a_late_span_resends_the_conversation_with_the_same_ids() -> None:
    received: list[ImportedSession] = []
    memory = InMemorySpanExporter()
    run_agent(memory, "conv-late")
    spans = list(memory.get_finished_spans())
    late = next(s for s in spans if s.name.startswith("execute_tool") and "passwd" in s.name)
    with OtlpReceiver(received.append, port=0, settle_s=0.2) as receiver:
        from producers.importers.otel import spans_from_proto

        receiver.receive(list(spans_from_proto(encode_spans([s for s in spans if s is not late]))))
        _wait(lambda: len(received) == 1)
        receiver.receive(list(spans_from_proto(encode_spans([late]))))
        _wait(lambda: len(received) == 2)
    first, second = received
    assert first.session_id == second.session_id
    earlier = {e["event_id"] for e in first.events if e["event_type"] in ("agent_input", "session_start")}
    assert earlier <= {e["event_id"] for e in second.events}
    assert second.steps == 2


def test_the_receiver_refuses_what_is_not_otlp() -> None:
    import urllib.error
    import urllib.request

    with OtlpReceiver(lambda s: None, port=0) as receiver:
        request = urllib.request.Request(
            receiver.endpoint, data=b"\x08\xff\xff", headers={"Content-Type": "application/x-protobuf"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        info.value.close()
        assert info.value.code == 400
