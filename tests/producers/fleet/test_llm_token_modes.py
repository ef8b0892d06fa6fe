"""The LLM agent's token modes, server shapes and bounds against the scripted server taught vLLM's, SGLang's
and llama.cpp's shapes (a test double at the network boundary; the real-server test is test_real_server.py)."""

import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig, reconstruct
from producers.fleet.llm.agent import REFUSED_CALL
from producers.fleet.llm.testing import IM_END, FakeOpenAIServer, Turn, emission, malformed_script, solver_script
from producers.fleet.llm.tito import parse_hermes
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from quality.failure import failure_causes
from schemas.registry import decode_event, encode_event

bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")


def _run(settings, server, caps=None, **config):
    sink = ListSink(decode=False)
    llm = LLMConfig(server.url, "policy-7b", backoff_s=0.01, **config)
    run_fleet(settings, "local", sessions=1, seed=3, sink=sink, agent="llm", llm=llm, caps=caps)
    # through the wire format: schema v4 keeps token_mode, engine and record_level
    return [decode_event(encode_event(e)) for e in sink.events]


def _calls(events):
    return [e["payload"]["model_call"] for e in events if e["event_type"] == "agent_input"]


def _end(events):
    return next(e["payload"] for e in events if e["event_type"] == "session_end")


def _generations(server):
    """The server's successful generation answers, in order."""
    return [json.loads(body) for body in server.responses]


def _server_ids(engine, body):
    if engine == "vllm":
        choice = body["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["prompt_token_ids"]
    if engine == "sglang":
        entries = body["meta_info"]["output_token_logprobs"]
        return body["output_ids"], [e[0] for e in entries], None
    return body["tokens"], [e["logprob"] for e in body["completion_probabilities"]], None


@bwrap
@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_token_in_token_out_keeps_one_exact_sequence_whatever_the_template_does(settings, engine):
    tasks = [task_for(3, 0)]
    # drift: the template re-renders tool calls with newlines and drops reasoning, as real ones do
    with FakeOpenAIServer(solver_script(tasks), engine=engine, drift=True, reasoning=True) as server:
        renderer = server if engine == "sglang" else None  # SGLang has no template endpoint: the model's tokenizer
        events = _run(settings, server, token_mode="tito", engine=engine, renderer=_Renderer(renderer))
        prompts_sent = [
            req.get("prompt") or req.get("input_ids")
            for req, path in zip(server.requests, server.paths, strict=True)
            if path.rstrip("/") in ("/v1/completions", "/generate", "/completion")
        ]
        generations = _generations(server)
        decode = server.tokenizer.decode
    assert _end(events)["exit_reason"] == "agent_finished"
    calls = _calls(events)
    assert {(c["token_mode"], c["engine"], c["record_level"]) for c in calls} == {("tito", engine, "token")}
    rebuilt = reconstruct(calls)
    assert len(rebuilt) == len(generations) == len(prompts_sent) == 6
    for i, (call, body) in enumerate(zip(rebuilt, generations, strict=True)):
        ids, logprobs, prompt_echo = _server_ids(engine, body)
        assert call.prompt_token_ids == prompts_sent[i]  # the sequence the server was sent, exactly
        if prompt_echo is not None:
            assert call.prompt_token_ids == prompt_echo
        assert json.dumps(call.completion_token_ids) == json.dumps(ids)  # every sampled id ...
        assert json.dumps(call.completion_logprobs) == json.dumps(logprobs)  # ... and logprob, as the server sent
        if i:
            previous = rebuilt[i - 1]
            context = previous.prompt_token_ids + previous.completion_token_ids
            assert call.prompt_token_ids[: len(context)] == context  # one sequence: each prompt extends the last
            added = decode(call.prompt_token_ids[len(context) :])
            # only the environment: the turn's closing (its end token was sampled), tool results, generation prompt
            assert added.startswith("\n<|im_start|>user\n<tool_response>") and added.endswith("<|im_start|>assistant\n")
            assert previous.completion_token_ids[-1] == IM_END
    # the reasoning the model emitted stays in the sequence (a chat template would have dropped it)
    assert "<think>" in decode(rebuilt[-1].prompt_token_ids)


class _Renderer:
    """The scripted server's template as the host-side renderer (``tokenizer=PATH`` in production), or None."""

    def __new__(cls, server):
        if server is None:
            return None
        instance = super().__new__(cls)
        instance.server = server
        return instance

    def render(self, messages, tools, *, add_generation_prompt, continue_final_message):
        return self.server.render_ids(
            messages, tools, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
        )


@bwrap
def test_chat_mode_against_a_drifting_template_exports_per_call_records(settings):
    tasks = [task_for(3, 0)]
    with FakeOpenAIServer(solver_script(tasks), drift=True) as server:
        events = _run(settings, server)
        generations = _generations(server)
    calls = reconstruct(_calls(events))
    assert len(calls) == 6
    extended = sum(
        1
        for a, b in zip(calls, calls[1:], strict=False)
        if b.prompt_token_ids[: len(a.prompt_token_ids) + len(a.completion_token_ids)]
        == a.prompt_token_ids + a.completion_token_ids
    )
    assert extended == 0  # the re-rendered tool calls break every pair, as against vLLM
    for call, body in zip(calls, generations, strict=True):  # yet every call keeps the server's own ids
        assert call.prompt_token_ids == body["prompt_token_ids"]
        assert call.completion_token_ids == body["choices"][0]["token_ids"]
    assert {(c["token_mode"], c["engine"], c["record_level"]) for c in _calls(events)} == {("chat", "vllm", "token")}


@bwrap
@pytest.mark.parametrize(("engine", "level"), [("llama.cpp", "token"), ("sglang", "message")])
def test_chat_mode_reads_llamacpp_ids_and_says_when_a_server_gives_none(settings, engine, level):
    tasks = [task_for(3, 0)]
    with FakeOpenAIServer(solver_script(tasks), engine=engine) as server:
        # llama.cpp is recognised by its answers; a server that returns no ids is what the flag says it is
        events = _run(settings, server, engine="auto" if engine == "llama.cpp" else engine)
        generations = _generations(server)
    calls = [c for c in _calls(events) if c["status"] == "ok"]
    assert {(c["engine"], c["record_level"]) for c in calls} == {(engine, level)}
    for call, body in zip(calls, generations, strict=True):
        entries = body["choices"][0]["logprobs"]["content"]
        expected = [e["id"] for e in entries] if engine == "llama.cpp" else []
        assert call["completion_token_ids"] == expected
        assert call["completion_logprobs"] == [e["logprob"] for e in entries]


@bwrap
@pytest.mark.parametrize(
    ("caps", "reason", "calls", "steps"),
    # at the model-call cap the last call's action is past the cap, as a valid one's would be
    [(Caps(max_steps=5), "max_steps", 5, 5), (Caps(max_model_calls=3), "max_model_calls", 3, 2)],
)
def test_malformed_and_unknown_tool_calls_count_against_the_caps(settings, caps, reason, calls, steps):
    with FakeOpenAIServer(malformed_script()) as server:
        events = _run(settings, server, caps=caps)
        made = len(server.responses)
    end = _end(events)
    assert (end["status"], end["exit_reason"]) == ("capped", reason)
    assert made == calls  # nothing ran, yet every refused call was a step and every call a model call
    # each refused call is a step: the action as the model wrote it, its error as the feedback
    actions = [e for e in events if e["event_type"] == "agent_action"]
    answers = {e["parent_event_id"]: e["payload"] for e in events if e["event_type"] == "env_feedback"}
    assert len(actions) == steps
    for action in actions:
        feedback = answers[action["event_id"]]
        assert feedback["failure_reason"] == REFUSED_CALL and feedback["exit_code"] is None
        assert (
            feedback["output"].startswith("error: ") and feedback["tool_call_id"] == action["payload"]["tool_call_id"]
        )
    assert {a["payload"]["tool_name"] for a in actions} <= {"bash", "frobnicate", "read_file", "(none)"}


@bwrap
def test_a_wrong_model_name_is_a_configuration_failure_not_a_rerun(settings):
    with FakeOpenAIServer(solver_script([task_for(3, 0)]), models={"policy-8b"}) as server:
        events = _run(settings, server, max_retries=4)
        tries = len(server.requests)
    end = _end(events)
    assert tries == 1  # not retried
    assert end["status"] == "error" and end["exit_reason"].startswith("model_config_error:")
    trajectories = pl.DataFrame(
        {"session_id": ["s"], "status": ["error"], "exit_reason": [end["exit_reason"]], "eval_passed": [False]}
    )
    steps = pl.DataFrame(schema={"session_id": pl.Utf8, "step_index": pl.Int64, "failure_reason": pl.Utf8})
    causes = failure_causes(trajectories, steps, pl.Series([], dtype=pl.Utf8))
    assert causes.row(0)[1:] == ("configuration_error", "fix_configuration")


def test_request_timeout_and_retries_are_flags_over_settings(settings, monkeypatch):
    from trajlake.fleet import _llm_options

    monkeypatch.setenv("TRAJLAKE_LLM_REQUEST_TIMEOUT_S", "900")
    monkeypatch.setenv("TRAJLAKE_LLM_MAX_RETRIES", "1")
    config = _llm_options("llm", "http://127.0.0.1:9/v1", "m", None, 0.0, 64)
    assert (config.timeout_s, config.max_retries, config.token_mode) == (900.0, 1, "chat")
    config = _llm_options(
        "llm", "http://127.0.0.1:9/v1", "m", None, 0.0, 64, request_timeout=30.0, token_mode="tito", engine="vllm"
    )
    assert (config.timeout_s, config.token_mode, config.engine) == (30.0, "tito", "vllm")


_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.fuzz
@settings(deadline=None)
@given(
    content=st.none() | st.text(max_size=40).filter(lambda t: "<tool_call>" not in t and "<think>" not in t),
    calls=st.lists(st.tuples(_NAMES, _JSON), max_size=3),
    noise=st.text(max_size=60),
)
def test_hermes_completions_parse_back_to_their_calls_and_any_text_parses(content, calls, noise):
    message = parse_hermes(emission(Turn(content, list(calls))), "call_0")
    parsed = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert parsed == [(name, args) for name, args in calls]
    assert message["content"] == ((content or "").strip() or None)
    odd = parse_hermes(noise, "call_1")  # whatever a model writes, the parser answers with a message
    assert odd["role"] == "assistant" and all(c["id"].startswith("call_1_") for c in odd.get("tool_calls", []))


def _chat_once(server, content):
    import urllib.request

    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": content}],
        "logprobs": True,
    }
    request = urllib.request.Request(
        f"{server.url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("text", ["Vérifié ✓ — déjà fait, 完成了", "all ascii here"])
def test_llamacpp_chat_ids_lost_inside_a_character_are_never_recorded_as_a_partial_sequence(text):
    """llama.cpp's chat logprobs skip tokens that end inside a multi-byte character: no partial id list."""
    from producers.fleet.llm.record import CallRecorder, ContentStore, parse_response

    script = lambda messages: Turn(text)  # noqa: E731
    with FakeOpenAIServer(script, engine="llama.cpp", byte_fallback=True) as server:
        response = _chat_once(server, "go")
        sampled = json.loads(server.responses[-1])
    entries = response["choices"][0]["logprobs"]["content"]
    counted = response["usage"]["completion_tokens"]
    parsed = parse_response(response)
    record = CallRecorder(ContentStore()).record(
        messages=[{"role": "user", "content": "go"}],
        tools=None,
        model="m",
        sampling={},
        response=response,
        latency_ms=1.0,
        engine="llama.cpp",
    )
    assert "".join(e["token"] for e in entries) == emission(Turn(text)) + "<|im_end|>"  # no text lost
    if text.isascii():  # every token has its entry: the ids are the server's, one per token
        assert len(entries) == counted and parsed.completion_token_ids == [e["id"] for e in entries]
        assert record["record_level"] == "token" and len(record["completion_logprobs"]) == counted
    else:  # the reproduction: fewer entries than tokens, so the ids are recorded as unavailable
        assert 0 < len(entries) < counted == sampled["usage"]["completion_tokens"]
        assert parsed.completion_token_ids == [] and parsed.logprobs == []
        assert record["record_level"] == "message" and record["completion_token_ids"] == []
        assert record["completion_logprobs"] == [] and record["completion_tokens"] == counted
