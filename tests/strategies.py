"""Hypothesis strategies shared by tests: schema-valid events of every payload kind."""

from __future__ import annotations

from hypothesis import strategies as st

text = st.text(st.characters(codec="utf-8"), max_size=200)


optional_text = st.none() | text


@st.composite
def events(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["agent_action", "env_feedback", "network_request", "session_end"]))
    payloads = {
        "agent_action": st.fixed_dictionaries(
            {
                "tool_name": text,
                "tool_call_id": text,
                "arguments": text,
                "command": optional_text,
                "thought": optional_text,
                "output_tokens": st.integers(0, 2**40),
                "reasoning_tokens": st.integers(0, 10**6),
                "cost_usd": st.floats(0, 100),
                "model_latency_ms": st.floats(0, 1e6),
            }
        ),
        "env_feedback": st.fixed_dictionaries(
            {
                "tool_call_id": text,
                "output": text,
                "exit_code": st.none() | st.integers(-(2**31), 2**31 - 1),
                "duration_ms": st.floats(0, 1e7),
                "truncated": st.booleans(),
                "output_bytes": st.integers(0, 2**40),
                "failure_reason": optional_text,
                "output_ref": st.none()
                | st.fixed_dictionaries({"uri": text, "size_bytes": st.integers(0, 2**40), "sha256": text}),
            }
        ),
        "network_request": st.fixed_dictionaries(
            {
                "host": text,
                "port": st.integers(0, 65535),
                "protocol": text,
                "allowed": st.booleans(),
                "bytes_sent": st.integers(0, 2**40),
                "error": optional_text,
            }
        ),
        "session_end": st.fixed_dictionaries(
            {
                "status": text,
                "reward": st.none() | st.floats(-1e6, 1e6),
                "runtime_s": st.floats(0, 1e6),
                "exit_reason": optional_text,
                "cpu_seconds": st.floats(0, 1e6),
                "peak_memory_bytes": st.integers(0, 2**50),
                "peak_processes": st.integers(0, 2**20),
                "disk_write_bytes": st.integers(0, 2**50),
            }
        ),
    }
    return {
        "event_id": draw(st.text(min_size=1, max_size=40)),
        "session_id": draw(st.text(min_size=1, max_size=40)),
        "seq": draw(st.integers(0, 2**62)),
        "ts": draw(st.integers(0, 4_000_000_000_000_000)),
        "event_type": kind,
        "source": draw(st.sampled_from(["agent", "environment", "system", "evaluator"])),
        "sandbox_id": draw(text),
        "task_id": draw(text),
        "task_type": draw(text),
        "host_id": draw(text),
        "image_name": draw(text),
        "image_version": draw(text),
        "agent_name": draw(optional_text),
        "agent_version": draw(optional_text),
        "agent_model": draw(optional_text),
        "policy_version": draw(optional_text),
        "agent_message_id": draw(optional_text),
        "parent_event_id": draw(optional_text),
        "extra": draw(st.dictionaries(text, text, max_size=4)),
        "payload": draw(payloads[kind]),
    }
