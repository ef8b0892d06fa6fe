"""How many model calls keep exact ids, chat mode vs token in/token out, against a running vLLM.

    python scripts/measure_token_modes.py http://127.0.0.1:8000 [--sessions 8] [--calls 6] [--model tiny]

The server must serve the model of ``scripts/tiny_model.py`` (or any model with a Hermes tool-call
template) under ``--model``; its random weights are steered to ``bash`` tool calls by vLLM's structured
outputs. The fleet runs the LLM agent through a recording proxy in each mode; each recorded call is
compared with the server's own answer, and each pair of consecutive calls is checked for the next
prompt extending the previous prompt + completion. Needs bubblewrap (local sandboxes).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common.settings import load_settings
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig, reconstruct
from producers.fleet.llm.proxy import RecordingProxy

TOOL_CALL = r'<tool_call>\{"name": "bash", "arguments": \{"command": "echo [a-z]{1,6}"\}\}</tool_call>'


def measure(url: str, sessions: int, calls: int, model: str, mode: str) -> str:
    """One mode's line: calls equal to the server's answers, pairs that extend."""
    settings = load_settings(home=Path(tempfile.mkdtemp()) / "home")
    with RecordingProxy(url) as proxy:
        sink = ListSink()
        llm = LLMConfig(
            proxy.url,
            model,
            max_tokens=64,
            timeout_s=600,
            token_mode=mode,
            engine="vllm",
            extra_body={"structured_outputs": {"regex": TOOL_CALL}},
        )
        caps = Caps(max_model_calls=calls)
        run_fleet(settings, "local", sessions=sessions, sink=sink, agent="llm", llm=llm, caps=caps, timeout_s=1800)
    records: dict[str, list[dict]] = {}
    for event in sink.events:
        if event["event_type"] == "agent_input":
            records.setdefault(event["session_id"], []).append(event["payload"]["model_call"])
    blobs = {b["sha256"]: b["text"] for rs in records.values() for r in rs for b in r["blobs"]}
    answers = {}
    for path, request, status, body in proxy.exchanges:
        if status == 200 and path in ("/v1/completions", "/v1/chat/completions"):
            answer = json.loads(body)
            choice = answer["choices"][0]
            prompt = request.get("prompt") if path == "/v1/completions" else answer.get("prompt_token_ids")
            logprobs = choice.get("logprobs") or {}
            values = logprobs.get("token_logprobs") or [e["logprob"] for e in logprobs.get("content") or []]
            answers[json.dumps(prompt)] = (choice.get("token_ids"), values)
    total = exact = pairs = extend = 0
    for rs in records.values():
        rebuilt = reconstruct(rs, blobs)
        for call in rebuilt:
            total += 1
            exact += answers.get(json.dumps(call.prompt_token_ids)) == (
                call.completion_token_ids,
                call.completion_logprobs,
            )
        for a, b in zip(rebuilt, rebuilt[1:], strict=False):
            context = (a.prompt_token_ids or []) + a.completion_token_ids
            pairs += 1
            extend += (b.prompt_token_ids or [])[: len(context)] == context
    return (
        f"{mode}: {len(records)} sessions, {exact}/{total} calls with ids and logprobs equal to the server's, "
        f"{extend}/{pairs} consecutive pairs extend prompt + completion"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the vLLM server's root URL (no /v1)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--calls", type=int, default=6, help="model calls per session (the cap)")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    for mode in ("chat", "tito"):
        print(measure(args.url.rstrip("/"), args.sessions, args.calls, args.model, mode))


if __name__ == "__main__":
    main()
