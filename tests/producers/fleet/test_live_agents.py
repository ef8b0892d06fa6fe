"""Live agents in the local fleet: the agent interface, the LLM agent against a scripted OpenAI-compatible
server on loopback (a test double at the network boundary), caps, retries, rollout groups."""

import json
from collections import Counter, defaultdict

import pytest

from common.prices import PriceTable
from pipelines.assemble import assemble
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig, reconstruct
from producers.fleet.llm.testing import FakeOpenAIServer, loop_script, solver_script
from producers.fleet.retry import plan_retries
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from schemas.registry import decode_event, encode_event
from tests.helpers import write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]


def _sessions(events):
    by_session = defaultdict(list)
    for event in events:
        by_session[event["session_id"]].append(event)
    return by_session


def _end(events):
    return next(e["payload"] for e in events if e["event_type"] == "session_end")


#: the cost cap estimates with the price table; a model without a price would cost nothing
PRICES = PriceTable.parse({"policy-7b": {"input": 3.0, "cached": 0.3, "output": 15.0}})


def _config(server, **kwargs):
    return LLMConfig(server.url, "policy-7b", backoff_s=0.01, **{"prices": PRICES, **kwargs})


def test_llm_session_lands_with_every_model_call_intact_and_transient_errors_retried(settings):
    tasks = [task_for(3, 0)]
    with FakeOpenAIServer(solver_script(tasks)) as server:
        server.fail_next = [429, 500]
        sink = ListSink(decode=False)
        report = run_fleet(settings, "local", sessions=1, seed=3, sink=sink, agent="llm", llm=_config(server))
    assert report.by_status == {"completed": 1} and report.eval_passed == 1
    # through the wire format (v3 encode/decode, redaction aside) into raw_events, then assembly
    write_raw(settings, sink.events)
    assemble(Lakehouse.open(settings))
    session_id = sink.events[0]["session_id"]
    columns, rows = run_query(
        settings,
        "SELECT agent_input.model_call AS mc, agent_message_id FROM events "
        "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL ORDER BY seq",
    )
    calls = [row[0] for row in rows]
    failed = [c for c in calls if c["status"] == "error"]
    assert [(c["http_status"], c["try_index"]) for c in failed] == [(429, 0), (500, 1)]  # retried and recorded
    ok = [c for c in calls if c["status"] == "ok"]
    assert len(ok) == len(server.responses) == 6
    rebuilt = reconstruct(calls)
    successful_requests = [r for r, status in zip(server.requests, server.statuses, strict=True) if status == 200]
    for call, request, raw, record in zip(rebuilt, successful_requests, server.responses, ok, strict=True):
        response = json.loads(raw)
        # the exact request messages and tool definitions the server received
        assert json.dumps(call.messages, sort_keys=True) == json.dumps(request["messages"], sort_keys=True)
        assert call.tools == request["tools"]
        # token ids and logprobs byte-equal to the server's JSON
        assert json.dumps(call.prompt_token_ids) == json.dumps(response["prompt_token_ids"])
        assert json.dumps(call.completion_token_ids) == json.dumps(response["choices"][0]["token_ids"])
        logprobs = [entry["logprob"] for entry in response["choices"][0]["logprobs"]["content"]]
        assert json.dumps(call.completion_logprobs) == json.dumps(logprobs)
        assert record["cached_tokens"] == response["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert record["finish_reason"] == response["choices"][0]["finish_reason"]
        assert json.loads(record["sampling_params"])["temperature"] == 0.0
    assert sum(c["cached_tokens"] for c in ok) > 0  # later calls reuse the prefix
    # the system prompt and tool list are stored once across the session's calls
    blob_refs = Counter(b["sha256"] for c in calls for b in c["blobs"])
    assert max(blob_refs.values()) == 1
    # every step links to the model call that made it; the trajectory counts the calls' tokens
    steps = run_query(
        settings,
        f"SELECT s.tool_name, e.agent_input.model_call.status FROM steps s JOIN events e "
        f"ON e.event_id = s.model_call_event_id WHERE s.session_id = '{session_id}' ORDER BY s.step_index",
    )[1]
    assert [tool for tool, _ in steps] == ["bash", "read_file", "bash", "write_file", "bash"]
    assert {status for _, status in steps} == {"ok"}
    trajectory = run_query(
        settings,
        "SELECT status, input_tokens, output_tokens, cost_usd, agent_model FROM trajectories "
        f"WHERE session_id = '{session_id}'",
    )[1][0]
    # every call counts, the last (the one that called submit, which has no action of its own) included;
    # no price table here and the server reported no cost: the cost is 0, not an invented one
    prompt, completion = sum(c["prompt_tokens"] for c in ok), sum(c["completion_tokens"] for c in ok)
    assert trajectory == ("completed", prompt, completion, 0.0, "policy-7b")
    assert ok[-1]["completion_tokens"] > 0 and all(c["cost_usd"] is None for c in ok)


@pytest.mark.parametrize(
    ("caps", "timeout_s", "delay_s", "reason"),
    [
        (Caps(max_steps=2), None, 0.0, "max_steps"),
        (Caps(max_model_tokens=150), None, 0.0, "max_model_tokens"),
        (Caps(max_cost_usd=1e-4), None, 0.0, "max_cost_usd"),
        (Caps(), 2.5, 0.4, "deadline"),
    ],
)
def test_each_cap_ends_the_session_with_its_exit_reason(settings, caps, timeout_s, delay_s, reason):
    with FakeOpenAIServer(loop_script(None), delay_s=delay_s) as server:  # never submits on its own
        sink = ListSink()
        run_fleet(
            settings, "local", sessions=1, sink=sink, agent="llm", llm=_config(server), caps=caps, timeout_s=timeout_s
        )
    end = _end(sink.events)
    assert (end["status"], end["exit_reason"]) == ("capped", reason)
    steps = sum(1 for e in sink.events if e["event_type"] == "agent_action")
    if reason == "max_steps":
        assert steps == 2
    assert any(e["event_type"] == "evaluation" for e in sink.events)  # evaluation follows as for any session


def test_a_group_of_k_lands_with_one_group_id(settings):
    sink = ListSink(decode=False)
    report = run_fleet(settings, "local", sessions=1, seed=5, sink=sink, agent="guesser", group_size=3)
    assert report.sessions == 3
    decoded = [decode_event(encode_event(event)) for event in sink.events]
    by_session = _sessions(decoded)
    assert len(by_session) == 3
    assert len({e["group_id"] for e in decoded}) == 1 and decoded[0]["group_id"]
    assert len({e["task_id"] for e in decoded}) == 1  # same seed, same instance
    write_raw(settings, sink.events)
    assemble(Lakehouse.open(settings))
    rows = run_query(settings, "SELECT group_id, attempt, task_id FROM trajectories ORDER BY attempt")[1]
    assert [r[1] for r in rows] == [1, 2, 3] and len({(r[0], r[2]) for r in rows}) == 1


def test_a_custom_agent_file_runs_and_a_raising_agent_fails_only_its_session(settings, tmp_path):
    agent_file = tmp_path / "my_agent.py"
    agent_file.write_text(
        "def agent(session):\n"
        "    assert 'Fix' in session.instruction or session.instruction\n"
        "    listing = session.run('ls')\n"
        "    session.write_file('notes/plan.txt', 'exit code ' + str(listing.exit_code))\n"
        "    text = session.read_file('notes/plan.txt')\n"
        "    try:\n"
        "        session.write_file('../outside.txt', 'x')\n"
        "    except Exception as exc:\n"
        "        session.run('echo refused: ' + type(exc).__name__)\n"
        "    session.run('echo ' + text.replace(' ', '_'))\n"
        "    session.submit()\n"
        "\n"
        "def broken(session):\n"
        "    session.run('true')\n"
        "    raise RuntimeError('my agent has a bug')\n"
    )
    sink = ListSink()
    run_fleet(settings, "local", sessions=1, sink=sink, agent=f"{agent_file}:agent")
    actions = [e["payload"] for e in sink.events if e["event_type"] == "agent_action"]
    assert [a["tool_name"] for a in actions] == ["bash", "write_file", "read_file", "bash", "bash"]
    outputs = [e["payload"]["output"] for e in sink.events if e["event_type"] == "env_feedback"]
    assert "refused: AgentToolError" in outputs[3] and "exit_code_0" in outputs[4]
    writes = [e["payload"]["path"] for e in sink.events if e["event_type"] == "file_op"]
    assert "/workspace/notes/plan.txt" in writes and not any("outside" in p for p in writes)
    assert _end(sink.events)["exit_reason"] == "agent_finished"

    broken = ListSink()
    report = run_fleet(settings, "local", sessions=2, concurrency=2, sink=broken, agent=f"{agent_file}:broken")
    assert report.sessions == 2  # the fleet did not crash
    for events in _sessions(broken.events).values():
        assert (_end(events)["status"], _end(events)["exit_reason"]) == ("failed", "agent_raised")
        note = next(e["payload"] for e in events if e["event_type"] == "annotation")
        assert note["key"] == "agent_error" and "RuntimeError: my agent has a bug" in note["value"]
        assert "Traceback" in note["value"]


def test_retries_follow_the_failure_cause():
    columns = ["session_id", "failure_cause", "retry_advice", "task_family", "group_id", "attempt", "original"]
    columns += ["task_seed", "agent_spec"]
    family = task_for(0, 0).family
    rows = [
        ("a", "infrastructure_error", "rerun", family, None, 1, "a", "11", "llm"),
        ("b", "wrong_answer", "do_not_rerun", family, None, 1, "b", "12", "llm"),
        ("c", "reaper_timeout", "rerun_once", family, None, 1, "c", "13", "solver"),
        ("d", "reaper_timeout", "rerun_once", family, None, 1, "d", "14", "solver"),
        ("d2", "reaper_timeout", "rerun_once", family, None, 2, "d", "14", "solver"),  # already rerun once
        ("e", "infrastructure_error", "rerun", family, "g1", 1, "e", "15", "llm"),
        ("e2", "infrastructure_error", "rerun", family, "g1", 2, "e", "15", "llm"),
        ("e3", "infrastructure_error", "rerun", family, "g1", 3, "e", "15", "llm"),  # at max_attempts
        ("f", "infrastructure_error", "rerun", family, "g2", 1, "f", "16", "llm"),  # a group member ...
        ("f2", "success", "none", family, "g2", 2, "f2", "16", "llm"),  # ... whose sibling holds attempt 2
    ]
    plans = plan_retries(columns, rows, max_attempts=3)
    assert [(p.retry_of, p.attempt, p.agent, p.task.seed, p.group_id) for p in plans] == [
        ("a", 2, "llm", 11, None),
        ("c", 2, "solver", 13, None),
        ("f", 3, "llm", 16, "g2"),
    ]


def test_model_call_events_encode_under_v3_and_stay_flat_over_30_turns():
    from producers.fleet.llm.client import ChatClient
    from producers.fleet.llm.record import CallRecorder, ContentStore, parse_response

    store = ContentStore()
    sizes = []
    with FakeOpenAIServer(loop_script(30, command="cat big_file_number")) as server:
        client = ChatClient(server.url)
        recorder = CallRecorder(store)
        messages = [{"role": "system", "content": "S" * 4000}, {"role": "user", "content": "do it"}]
        for turn in range(30):
            attempt, _ = client.complete(
                {"model": "m", "messages": messages, "logprobs": True, "return_token_ids": True}
            )
            record = recorder.record(
                messages=messages, tools=None, model="m", sampling={}, response=attempt.body, latency_ms=1.0
            )
            event = {
                "event_id": f"e{turn}",
                "session_id": "s",
                "seq": turn,
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
                    "input_tokens": record["prompt_tokens"],
                    "cached_tokens": record["cached_tokens"],
                    "n_messages": record["n_messages"],
                    "model_call": record,
                },
            }
            sizes.append(len(encode_event(event)))
            parsed = parse_response(attempt.body)
            messages.append(parsed.message)
            calls = parsed.message.get("tool_calls") or []
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"output {turn} " * 40} for c in calls]
        client.close()
    context_bytes = len(json.dumps(messages))
    assert sizes[0] > 4000 > sizes[-1]  # the system prompt is in the first event only
    assert max(sizes[2:]) < 1.5 * min(sizes[2:])  # flat: O(new content), not O(context)
    assert sizes[-1] * 10 < context_bytes
    assert decode_event(encode_event(event))["payload"]["model_call"]["call_index"] == 29


@pytest.mark.integration
def test_fleet_resource_runs_a_custom_agent_through_kafka_into_the_lake(kafka_settings, tmp_path):
    from dagster_project.defs.fleet import FleetResource
    from pipelines.ingest import IngestWorker

    agent_file = tmp_path / "agent.py"
    agent_file.write_text("def agent(session):\n    session.run('ls')\n    session.submit()\n")
    resource = FleetResource(backend="local", agent=f"{agent_file}:agent", max_steps=5, group_size=2)
    report = resource.launch(kafka_settings, 1, None)
    assert report.sessions == 2
    stats = IngestWorker(kafka_settings).run(until_idle=2)
    assert stats.dead_letters == 0
    assemble(Lakehouse.open(kafka_settings))
    rows = run_query(kafka_settings, "SELECT agent_name, n_steps, exit_reason, attempt FROM trajectories ORDER BY 4")[1]
    assert rows == [(f"{agent_file}:agent", 1, "agent_finished", 1), (f"{agent_file}:agent", 1, "agent_finished", 2)]


@pytest.mark.integration
def test_cli_custom_agent_file_llm_agent_and_retry_by_cause(tmp_path, broker):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(
        TRAJLAKE_HOME=str(tmp_path / "home"),
        TRAJLAKE_KAFKA_BOOTSTRAP=broker,
        TRAJLAKE_TOPIC=f"live-{tmp_path.name[-12:]}",
        TRAJLAKE_CONSUMER_GROUP=f"live-{tmp_path.name[-12:]}",
    )

    def trajlake(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"trajlake {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def land() -> None:
        trajlake("ingest", "--until-idle", "2")
        trajlake("assemble")
        trajlake("score")

    def sql(query: str) -> list[dict]:
        return json.loads(trajlake("sql", query, "--format", "json"))

    agent_file = tmp_path / "mine.py"
    agent_file.write_text("def agent(session):\n    session.run('ls')\n")
    trajlake("fleet", "run", "--backend", "local", "--sessions", "1", "--agent", f"{agent_file}:agent")
    with FakeOpenAIServer(solver_script([task_for(0, 0)])) as server:
        llm = ["--model-endpoint", server.url, "--model", "policy-7b"]
        server.fail_next = [500] * 5  # past the 4 retries: the session fails on the model API
        trajlake("fleet", "run", "--backend", "local", "--sessions", "1", "--agent", "llm", *llm)
        land()
        rows = sql(
            "SELECT t.agent_name, t.exit_reason, s.retry_advice FROM trajectories t JOIN scores s USING (session_id)"
        )
        by_agent = {r["agent_name"]: r for r in rows}
        assert by_agent[f"{agent_file}:agent"]["retry_advice"] == "do_not_rerun"  # a capability failure
        assert "HTTP 500" in by_agent["llm-agent"]["exit_reason"] and by_agent["llm-agent"]["retry_advice"] == "rerun"
        assert "retried 1 sessions" in trajlake("fleet", "retry", "--max-attempts", "2", *llm)
        land()
        retried = sql("SELECT attempt, retry_of, status, eval_passed FROM trajectories WHERE retry_of IS NOT NULL")
        original = sql("SELECT session_id FROM trajectories WHERE agent_name = 'llm-agent' AND retry_of IS NULL")
        assert retried == [
            {"attempt": 2, "retry_of": original[0]["session_id"], "status": "completed", "eval_passed": True}
        ]
        assert "nothing to retry" in trajlake("fleet", "retry", *llm)  # the retry succeeded


def test_model_api_timeouts_are_retried_then_reported():
    from producers.errors import ModelAPIError
    from producers.fleet.llm.client import ChatClient

    failures = []
    with FakeOpenAIServer(loop_script(1), delay_s=0.5) as server:
        client = ChatClient(server.url, timeout_s=0.1, max_retries=2, backoff_s=0.01)
        with pytest.raises(ModelAPIError, match="timeout"):
            client.complete({"model": "m", "messages": []}, on_failure=lambda t, i: failures.append((t.status, i)))
        server.fail_next = [400]
        client.timeout_s = 5.0
        with pytest.raises(ModelAPIError, match="HTTP 400"):  # not transient: no retry
            client.complete({"model": "m", "messages": []}, on_failure=lambda t, i: failures.append((t.status, i)))
        client.close()
    assert failures == [(None, 0), (None, 1), (None, 2), (400, 0)]


def test_a_reasoning_models_reasoning_is_recorded_but_not_sent_back() -> None:
    from producers.fleet.llm.record import parse_response, request_message

    for field in ("reasoning_content", "reasoning"):  # DeepSeek/SGLang, vLLM
        response = {"choices": [{"message": {"role": "assistant", "content": "ls", field: "think first"}}]}
        reply = parse_response(response).message
        assert reply["reasoning_content"] == "think first" and reply["content"] == "ls"
        assert request_message(reply) == {"role": "assistant", "content": "ls"}
