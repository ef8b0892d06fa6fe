"""The LLM agent through the fleet against a real OpenAI-compatible server: vLLM's CPU build serving a tiny
model built at test time (random weights, a tokenizer trained here, a ChatML template with Hermes tool calls).

Stress tier (``-m stress``): the server takes a few minutes to start on two cores. It runs from its own
virtual environment, made by ``scripts/vllm.sh`` (``TRAJLAKE_VLLM_VENV``, default
``~/.cache/trajlake/vllm-venv``); without it the tests skip and say so. ``TRAJLAKE_VLLM_URL`` points
them at a server already serving that model as ``tiny`` instead. A recording proxy between
the fleet and the server keeps the server's own answers to compare with what the fleet recorded.
The model's random weights are steered with vLLM's structured outputs so that every turn is a tool
call (a bash ``echo``); a session ends at its model-call cap.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines.export.conversation import from_calls
from pipelines.export.rl import token_segments
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig, reconstruct
from producers.fleet.llm.proxy import RecordingProxy
from producers.fleet.sandbox import bwrap_available

pytestmark = [
    pytest.mark.stress,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("TRAJLAKE_VLLM_VENV", Path.home() / ".cache" / "trajlake" / "vllm-venv"))
#: every turn a bash echo in the Hermes format, as the model's own text
TOOL_CALL = r'<tool_call>\{"name": "bash", "arguments": \{"command": "echo [a-z]{1,6}"\}\}</tool_call>'
CALLS = 4  # model calls per session (the cap ends it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    if os.environ.get("TRAJLAKE_VLLM_URL"):  # a server already serving scripts/tiny_model.py's model as "tiny"
        yield os.environ["TRAJLAKE_VLLM_URL"].rstrip("/")
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VENV}: run scripts/vllm.sh (vLLM's CPU build from PyPI)")
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"vLLM does not import in {VENV}: {probe.stderr.strip().splitlines()[-1:]}")
    model = tmp_path_factory.mktemp("tiny") / "model"
    built = subprocess.run(
        [python, ROOT / "scripts" / "tiny_model.py", model], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, built.stderr[-2000:]
    port = _free_port()
    log = (tmp_path_factory.mktemp("vllm") / "server.log").open("w")
    server = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny"]
        + ["--dtype", "float32", "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
        + ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enforce-eager"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1200
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM exited with {server.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM did not answer within 20 minutes; see {log.name}")
                time.sleep(2)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its engine processes (its own session)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def _session(settings, proxy, sessions=2, **config):
    sink = ListSink()
    llm = LLMConfig(
        proxy.url,
        "tiny",
        max_tokens=64,
        timeout_s=600,
        extra_body={"structured_outputs": {"regex": TOOL_CALL}},
        **config,
    )
    # a CPU server on a shared 2-core machine is slow: the session deadline must not be what ends a session
    caps = Caps(max_model_calls=CALLS)
    run_fleet(settings, "local", sessions=sessions, sink=sink, agent="llm", llm=llm, caps=caps, timeout_s=1200)
    by_session: dict[str, list] = {}
    for event in sink.events:
        if event["event_type"] == "agent_input":
            by_session.setdefault(event["session_id"], []).append(event["payload"]["model_call"])
    return by_session


def _blobs(sessions) -> dict[str, str]:
    return {b["sha256"]: b["text"] for records in sessions.values() for r in records for b in r["blobs"]}


def _extends(a, b) -> bool:
    context = a.prompt_token_ids + a.completion_token_ids
    return b.prompt_token_ids[: len(context)] == context


def test_token_in_token_out_against_vllm_is_one_exact_sequence(settings, vllm_server):
    with RecordingProxy(vllm_server) as proxy:
        sessions = _session(settings, proxy, token_mode="tito", engine="vllm")
    answers = [
        (request, json.loads(body)) for path, request, status, body in proxy.exchanges if path == "/v1/completions"
    ]
    assert all(status == 200 for _, _, status, _ in proxy.exchanges)
    by_prompt = {json.dumps(request["prompt"]): answer for request, answer in answers}
    blobs = _blobs(sessions)  # the fleet stores content once: a system prompt is in the first session's events
    (eos,) = _post(vllm_server, "/tokenize", {"model": "tiny", "prompt": "<|im_end|>", "add_special_tokens": False})[
        "tokens"
    ]
    assert len(sessions) == 2 and sum(len(calls) for calls in sessions.values()) == len(answers) == 2 * CALLS
    for records in sessions.values():
        assert {(r["token_mode"], r["engine"], r["record_level"]) for r in records} == {("tito", "vllm", "token")}
        calls = reconstruct(records, blobs)
        assert len(calls) == CALLS
        sampled: list[int] = []
        sampled_logprobs: list[float] = []
        for i, call in enumerate(calls):
            answer = by_prompt[json.dumps(call.prompt_token_ids)]  # the exact prompt the server was sent
            choice = answer["choices"][0]
            assert call.prompt_token_ids == choice["prompt_token_ids"]  # ... and says it evaluated
            assert call.completion_token_ids == choice["token_ids"]  # every sampled id
            assert call.completion_logprobs == choice["logprobs"]["token_logprobs"]  # every logprob, bit for bit
            sampled += call.completion_token_ids
            sampled_logprobs += call.completion_logprobs
            if i:
                assert _extends(calls[i - 1], call)  # one sequence
                previous = calls[i - 1]
                added = call.prompt_token_ids[len(previous.prompt_token_ids) + len(previous.completion_token_ids) :]
                text = _post(vllm_server, "/detokenize", {"model": "tiny", "tokens": added})["prompt"]
                # only the environment: the template's "\n" after the end-of-turn token the model sampled,
                # the tool results, the next generation prompt
                assert previous.completion_token_ids[-1] == eos
                assert text.startswith("\n<|im_start|>user<tool_response>") and text.endswith("<|im_start|>assistant\n")
        # the training sample: every sampled token under mask 1 with its logprob, every environment token masked
        conversation = from_calls([{**r, "_ts": None} for r in records], lambda refs: {r: blobs[r] for r in refs})
        assert conversation is not None
        (segment,) = token_segments(conversation.calls) or [None]  # one exact sequence: one segment
        assert segment is not None
        prompt, response, mask, logprobs = (
            segment.prompt_ids,
            segment.response_ids,
            segment.response_mask,
            segment.logprobs,
        )
        assert prompt == calls[0].prompt_token_ids
        assert [t for t, m in zip(response, mask, strict=True) if m] == sampled
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == sampled_logprobs
        assert prompt + response == calls[-1].prompt_token_ids + calls[-1].completion_token_ids


def test_chat_mode_against_vllm_keeps_per_call_records_where_the_template_rewrites_history(settings, vllm_server):
    with RecordingProxy(vllm_server) as proxy:
        sessions = _session(settings, proxy, sessions=1)
    answers = [json.loads(body) for path, _, _, body in proxy.exchanges if path == "/v1/chat/completions"]
    (records,) = sessions.values()
    calls = reconstruct(records, _blobs(sessions))
    assert len(calls) == len(answers) == CALLS
    for call, answer in zip(calls, answers, strict=True):
        assert call.prompt_token_ids == answer["prompt_token_ids"]
        assert call.completion_token_ids == answer["choices"][0]["token_ids"]
        assert call.completion_logprobs == [e["logprob"] for e in answer["choices"][0]["logprobs"]["content"]]
    assert {(r["token_mode"], r["engine"], r["record_level"]) for r in records} == {("chat", "vllm", "token")}
    # the template re-renders <tool_call>{…}</tool_call> with newlines: no next prompt extends the last
    assert sum(_extends(a, b) for a, b in zip(calls, calls[1:], strict=False)) == 0


def test_a_model_call_cap_truncates_and_a_failed_tokenize_call_is_an_event_against_vllm(settings, vllm_server):
    """Issue 47: the cap is a truncated episode (never ``terminal``); a failed ``/tokenize`` leaves its event."""
    from pipelines.export.formats import stop_reason

    sink = ListSink()
    regex = {"structured_outputs": {"regex": TOOL_CALL}}
    endpoint = f"{vllm_server}/v1"  # the OpenAI base URL (the agent finds /tokenize beside it)
    llm = LLMConfig(endpoint, "tiny", max_tokens=64, timeout_s=600, extra_body=regex, token_mode="tito", engine="vllm")
    run_fleet(
        settings, "local", sessions=1, sink=sink, agent="llm", llm=llm, caps=Caps(max_model_calls=2), timeout_s=1200
    )
    end = next(e["payload"] for e in sink.events if e["event_type"] == "session_end")
    records = [e["payload"]["model_call"] for e in sink.events if e["event_type"] == "agent_input"]
    assert end["exit_reason"] == "max_model_calls" and len(records) == 2
    blobs = {b["sha256"]: b["text"] for r in records for b in r["blobs"]}
    conversation = from_calls([{**r, "_ts": None} for r in records], lambda refs: {r: blobs[r] for r in refs})
    assert conversation is not None
    assert stop_reason(end, conversation) == "truncated:max_model_calls"
    # a model name the server does not serve: its /tokenize answers 404 before any generation
    sink = ListSink()
    llm = LLMConfig(endpoint, "not-served", timeout_s=600, token_mode="tito", engine="vllm", max_retries=0)
    run_fleet(settings, "local", sessions=1, sink=sink, agent="llm", llm=llm, timeout_s=1200)
    failed = [e["payload"]["model_call"] for e in sink.events if e["event_type"] == "agent_input"]
    assert [(c["status"], c["http_status"]) for c in failed] == [("error", 404)]
    assert failed[0]["error"].startswith("tokenize: ")


@pytest.mark.skipif(
    not os.environ.get("TRAJLAKE_LLAMACPP_URL"), reason="no llama.cpp server (TRAJLAKE_LLAMACPP_URL=http://host:port)"
)
def test_llamacpp_chat_ids_are_whole_or_absent():
    """Against a real llama.cpp server: a reply's ids are every sampled token's, or none (message level) when its
    chat logprobs skipped tokens ending inside a multi-byte character, never a partial sequence."""
    from producers.fleet.llm.record import parse_response

    base = os.environ["TRAJLAKE_LLAMACPP_URL"].rstrip("/")
    for prompt in ("Write five words in Chinese and three emoji.", "Say: déjà vu, naïve, ✓ ✗ → ←"):
        body = {"messages": [{"role": "user", "content": prompt}], "logprobs": True, "max_tokens": 96}
        response = _post(base, "/v1/chat/completions", body)
        parsed = parse_response(response)
        counted = response["usage"]["completion_tokens"]
        assert parsed.completion_token_ids == [] or len(parsed.completion_token_ids) == counted
        assert len(parsed.logprobs) == len(parsed.completion_token_ids)
