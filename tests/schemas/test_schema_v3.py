"""Schema v3 (rollout groups, retries, model calls) next to v1 and v2: FULL with v2, BACKWARD with v1."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import fastavro

from schemas.compat import Compatibility, check_compatibility
from schemas.iceberg import raw_events_schema
from schemas.registry import HEADER_LEN, decode_event, encode_event, get_version
from tests.helpers import sample_events

ROOT = Path(__file__).resolve().parents[2]
AVRO = ROOT / "schemas" / "avro"


def _model_call_event() -> dict:
    base = next(e for e in sample_events(1) if e["event_type"] == "agent_input")
    call = {
        "call_index": 0,
        "model": "policy-7b",
        "response_model": "policy-7b",
        "response_id": "chatcmpl-1",
        "sampling_params": '{"temperature":0.0}',
        "tools_sha256": None,
        "prefix_messages": 0,
        "new_messages": ["a" * 64],
        "request_sha256": "b" * 64,
        "n_messages": 1,
        "blobs": [{"sha256": "a" * 64, "text": '{"content":"hi","role":"user"}'}],
        "status": "ok",
        "try_index": 0,
        "http_status": 200,
        "error": None,
        "finish_reason": "stop",
        "response_message_sha256": "c" * 64,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "cached_tokens": 0,
        "reasoning_tokens": None,
        "latency_ms": 12.5,
        "cost_usd": 1e-6,
        "prompt_token_ids_shared": 0,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [7, 8],
        "completion_logprobs": [-0.25, -1.125],
        "completion_tokens_text": ["token_id:7", "token_id:8"],
    }
    return {
        **base,
        "group_id": "g1",
        "attempt": 2,
        "retry_of": None,
        "payload": {**base["payload"], "model_call": call},
    }


def test_v3_is_full_compatible_with_v2_and_backward_with_v1() -> None:
    v1, v2, v3 = (get_version(n).raw for n in (1, 2, 3))
    assert check_compatibility(v2, v3, Compatibility.FULL) == []
    assert check_compatibility(v1, v3, Compatibility.BACKWARD) == []


def test_a_v2_reader_reads_a_v3_model_call_and_v3_reads_old_data_with_defaults() -> None:
    event = _model_call_event()
    data = encode_event(event)
    # an old consumer (v2 reader) skips what it does not know: the event is not a dead letter there
    old = fastavro.schemaless_reader(
        io.BytesIO(data[HEADER_LEN:]), get_version(3).parsed, get_version(2).parsed, return_record_name=True
    )
    assert isinstance(old, dict)
    assert old["event_id"] == event["event_id"] and "group_id" not in old
    assert old["payload"][1]["input_tokens"] == event["payload"]["input_tokens"]
    new = decode_event(data)
    assert new["group_id"] == "g1" and new["attempt"] == 2
    assert new["payload"]["model_call"]["completion_logprobs"] == [-0.25, -1.125]
    assert new["payload"]["model_call"]["blobs"][0]["text"] == '{"content":"hi","role":"user"}'
    old_event = decode_event(
        encode_event(
            {k: v for k, v in event.items() if k not in ("group_id", "attempt", "retry_of")}
            | {"payload": {k: v for k, v in event["payload"].items() if k != "model_call"}},
            version=2,
        )
    )
    assert old_event["group_id"] is None and old_event["payload"]["model_call"] is None


def test_iceberg_schema_has_the_v3_columns() -> None:
    schema = raw_events_schema()
    for name in ("group_id", "attempt", "retry_of"):
        assert schema.find_field(name)
    assert schema.find_field("agent_input.model_call.completion_token_ids")
    assert schema.find_field("agent_input.model_call.blobs")


def test_cli_schema_check_accepts_v3_both_ways() -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trajlake.cli", "schema", "check", *args], capture_output=True, text=True, cwd=ROOT
        )

    v1, v2, v3 = (str(AVRO / f"trajlake.event.v{n}.avsc") for n in (1, 2, 3))
    full = check("--old", v2, "--new", v3, "--mode", "full")
    assert full.returncode == 0, full.stdout + full.stderr
    assert check("--old", v1, "--new", v3, "--mode", "backward").returncode == 0
    assert check().returncode == 0  # every shipped pair, backward
