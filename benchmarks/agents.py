"""Live-agent benchmarks: host overhead per model call, LLM-agent fleet throughput, bytes per model call.

``trajlake bench agents`` prints and returns:

- ``host_cpu_ms_per_call_p50/p95``: the host thread's CPU time per model call of a 30-turn
  conversation against the scripted OpenAI-compatible server on loopback
  (``producers.fleet.llm.testing``, a test double, in a process of its own): request JSON, HTTP
  exchange, response parse, the content-addressed record, redaction and v3 Avro encoding of the
  event; robust to the machine's load. ``host_overhead_ms_p50/p95``: the host's wall time per call
  minus the server's own handling time (sent back as ``X-Server-Time-Ms``), which on a loaded
  machine includes waiting to be scheduled. ``http_only_*``: the same without recording (the
  same-run baseline);
- ``llm_sessions_per_min_c4``: complete local sessions (LLM agent + fresh-sandbox evaluation)
  per minute at concurrency 4, and ``scripted_sessions_per_min_c4`` (the scripted solver on the
  same tasks, same run);
- ``model_call_event_bytes``: the encoded size of each model-call event of a 30-turn session
  (first, second, median, last, max/min over calls 2..30) next to the size of the whole request
  context at the last call: flat per event, while the context grows.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from typing import Any

from common.settings import Settings
from producers.fleet import ListSink, percentiles, run_fleet
from producers.fleet.llm import LLMConfig
from producers.fleet.llm.agent import SYSTEM_PROMPT, TOOLS
from producers.fleet.llm.client import ChatClient
from producers.fleet.llm.record import CallRecorder, ContentStore, parse_response
from producers.fleet.llm.testing import FakeOpenAIServer, loop_script, solver_script
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from producers.redact import redact_value
from schemas.registry import encode_event


def _event(record: dict[str, Any], seq: int) -> dict[str, Any]:
    return {
        "event_id": f"bench-{seq}",
        "session_id": "bench",
        "seq": seq,
        "ts": 0,
        "event_type": "agent_input",
        "source": "agent",
        "sandbox_id": "sb",
        "task_id": "t",
        "task_type": "bugfix",
        "host_id": "h",
        "image_name": "i",
        "image_version": "1",
        "payload": {
            "prompt_digest": record["request_sha256"],
            "input_tokens": record["prompt_tokens"] or 0,
            "cached_tokens": record["cached_tokens"] or 0,
            "n_messages": record["n_messages"],
            "model_call": record,
        },
    }


def _serve(turns: int, urls: Any, stop: Any) -> None:
    """The scripted server in a process of its own (its CPU must not count as the host's)."""
    with FakeOpenAIServer(loop_script(turns)) as server:
        urls.put(server.url)
        stop.wait()


def conversation_overhead(turns: int = 30, record: bool = True, output_bytes: int = 600) -> dict[str, Any]:
    """One ``turns``-call conversation against the scripted server: host ms per call beyond the server's.

    The server runs in another process and reports its own handling time (``X-Server-Time-Ms``).
    """
    context = multiprocessing.get_context("spawn")
    urls, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve, args=(turns, urls, stop), daemon=True)
    process.start()
    try:
        client = ChatClient(urls.get(timeout=60))
        recorder = CallRecorder(ContentStore())
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Fix the bug in the workspace."},
        ]
        host_ms: list[float] = []
        cpu_ms: list[float] = []  # the host thread's CPU: what the host spends, whatever the machine's load
        sizes: list[int] = []
        sampling = {"temperature": 0.0, "max_tokens": 1024, "logprobs": True, "return_token_ids": True}
        for turn in range(turns):
            started, cpu = time.perf_counter(), time.thread_time()
            attempt, _ = client.complete({"model": "bench", "messages": messages, "tools": TOOLS, **sampling})
            assert attempt.body is not None
            parsed = parse_response(attempt.body)
            if record:
                call = recorder.record(
                    messages=messages,
                    tools=TOOLS,
                    model="bench",
                    sampling=sampling,
                    response=attempt.body,
                    latency_ms=attempt.latency_ms,
                )
                sizes.append(len(encode_event(redact_value(_event(call, turn)))))
            wall = (time.perf_counter() - started) * 1000
            cpu_ms.append((time.thread_time() - cpu) * 1000)
            host_ms.append(wall - float((attempt.headers or {}).get("X-Server-Time-Ms", 0.0)))
            messages.append(parsed.message)
            for tool_call in parsed.message.get("tool_calls") or []:
                output = (f"line {turn} of the command's output\n" * (output_bytes // 30))[:output_bytes]
                messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": output})
        client.close()
    finally:
        stop.set()
        process.join(10)
    context_bytes = len(encode_event(_event(recorder_full_context(messages), 0))) if record else 0
    return {"host_ms": host_ms, "cpu_ms": cpu_ms, "sizes": sizes, "context_bytes": context_bytes}


def recorder_full_context(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A model-call record that stores the whole context inline (what a naive event would carry)."""
    recorder = CallRecorder(ContentStore())
    return recorder.record(messages=messages, tools=TOOLS, model="bench", sampling={}, response=None, latency_ms=0.0)


def run_agent_benchmarks(settings: Settings, sessions: int = 8, seed: int = 0) -> dict[str, float]:
    """Measure the live-agent figures (small sizes: the machine is shared) and print them."""
    figures: dict[str, float] = {}
    recorded = conversation_overhead(30, record=True)
    baseline = conversation_overhead(30, record=False)
    steady = recorded["host_ms"][1:]  # the first call opens the connection
    figures.update(percentiles(steady, "host_overhead_ms"))
    figures.update(percentiles(recorded["cpu_ms"][1:], "host_cpu_ms_per_call"))
    figures["http_only_overhead_ms_p50"] = round(statistics.median(baseline["host_ms"][1:]), 3)
    figures["http_only_cpu_ms_per_call_p50"] = round(statistics.median(baseline["cpu_ms"][1:]), 3)
    sizes = recorded["sizes"]
    figures["model_call_event_bytes_first"] = sizes[0]
    figures["model_call_event_bytes_second"] = sizes[1]
    figures["model_call_event_bytes_p50"] = int(statistics.median(sizes))
    figures["model_call_event_bytes_last"] = sizes[-1]
    figures["model_call_event_bytes_max_over_min_2_30"] = round(max(sizes[1:]) / min(sizes[1:]), 2)
    figures["full_context_bytes_at_call_30"] = recorded["context_bytes"]
    if bwrap_available():
        tasks = [task_for(seed, i) for i in range(sessions)]
        with FakeOpenAIServer(solver_script(tasks)) as server:
            report = run_fleet(
                settings,
                "local",
                sessions,
                concurrency=4,
                seed=seed,
                sink=ListSink(),
                agent="llm",
                llm=LLMConfig(server.url, "bench"),
            )
        figures["llm_sessions_per_min_c4"] = round(report.sessions_per_min, 1)
        figures["llm_sessions_passed"] = report.eval_passed
        scripted = run_fleet(settings, "local", sessions, concurrency=4, seed=seed, sink=ListSink(), agent="solver")
        figures["scripted_sessions_per_min_c4"] = round(scripted.sessions_per_min, 1)
        figures["sessions"] = sessions
    for key, value in figures.items():
        print(f"{key}: {value}")
    print("per-call event bytes over 30 turns:", " ".join(str(s) for s in sizes))
    return figures


if __name__ == "__main__":
    from common.settings import load_settings

    run_agent_benchmarks(load_settings())
