"""Secret redaction: a fake-secret corpus in every field, real runs unchanged, JSON kept JSON, export's pass."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.secret_corpus import (
    CONTEXTS,
    FIELDS,
    REAL_RUNS_DIR,
    corpus_sessions,
    fake_cases,
    in_context,
    injected_values,
    leaks,
    place,
    real_run_files,
    real_run_strings,
    real_runs,
    strings_of,
)
from pipelines.export import ExportFilters
from producers.errors import RedactionError
from producers.redact import (
    MAX_DEPTH,
    REDACTED,
    forget_secret_values,
    is_secret_name,
    redact_array,
    redact_json_text,
    redact_text,
    redact_value,
    register_secret_values,
)
from producers.sdk import EventProducer
from schemas.registry import decode_event
from tests.helpers import sample_events
from warehouse.lakehouse import Lakehouse

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

CASES = fake_cases()


@pytest.fixture
def injected():
    """The fleet's per-task secrets, registered as ``LocalFleet`` does for every sandbox."""
    values = injected_values(CASES)
    register_secret_values(values)
    yield values
    forget_secret_values(values)


def _capturing_producer() -> tuple[EventProducer, list[bytes]]:
    """A real ``EventProducer`` (redaction on) whose encoded bytes are kept instead of sent to Kafka."""
    sent: list[bytes] = []
    producer = EventProducer.__new__(EventProducer)
    producer.redact, producer.schema_version, producer.host_id = True, None, "test-host"
    # a capturing stand-in for the Kafka send: assigning to a method is what mypy flags
    producer.send = lambda session_id, event_id, value: sent.append(value)  # type: ignore[method-assign]
    return producer, sent


def test_corpus_has_many_distinct_kinds_and_every_field():
    assert len({case.kind for case in CASES}) >= 60
    assert {"command", "arguments", "file_content", "thought", "output", "env"} <= set(FIELDS)
    assert all(case.secrets and all(s in case.text for s in case.secrets) for case in CASES)


@pytest.mark.parametrize("field", FIELDS)
def test_every_corpus_secret_is_redacted_through_the_sdk(field, injected):
    producer, sent = _capturing_producer()
    leaked = {}
    for case, placed, events in corpus_sessions(CASES):
        if placed != field:
            continue
        sent.clear()
        for event in events:
            producer.emit(event)  # what SessionEmitter(producer.emit) does for every event
        decoded = [decode_event(value) for value in sent]
        assert len(decoded) == len(events)
        assert leaks(case, events) == list(case.secrets)  # the unredacted events do hold the secrets
        if left := leaks(case, decoded):
            leaked[case.kind] = left
    assert leaked == {}


@pytest.mark.parametrize("context", CONTEXTS)
def test_corpus_secrets_in_other_surroundings_are_redacted(context, injected):
    producer, sent = _capturing_producer()
    leaked = {}
    for case in fake_cases(seed=5):  # other secrets than the ones the rules were tried on
        wrapped = in_context(case, context)
        register_secret_values(injected_values([wrapped]))
        sent.clear()
        for event in place(wrapped, "output"):
            producer.emit(event)
        forget_secret_values(injected_values([wrapped]))
        if left := leaks(wrapped, [decode_event(value) for value in sent]):
            leaked[case.kind] = left
    assert leaked == {}


def test_session_emitter_of_a_producer_redacts(injected):
    producer, sent = _capturing_producer()
    case = next(c for c in CASES if c.kind == "fleet_task_token_alone")
    session = producer.session(task_id="t", task_type="bugfix", sandbox_id="sb", image_name="i", image_version="1")
    action = session.action("bash", command="cat /run/secrets/task.env | cut -d= -f2", thought=case.text)
    session.feedback(action, output=case.text, exit_code=0)
    decoded = [decode_event(value) for value in sent]
    assert leaks(case, decoded) == [] and sum(REDACTED in t for t in strings_of(decoded)) == 2


def test_injected_values_are_redacted_whatever_surrounds_them_until_forgotten():
    value = "0f3a9c1e5b7d2f4a6c8e0b1d3f5a7c9e"
    text = f"x{value}y and {value[:16]}-{value[16:]}"
    assert redact_text(text) == text
    register_secret_values([value, "short"])
    try:
        assert redact_text(text) == f"x{REDACTED}y and {value[:16]}-{value[16:]}"
        assert redact_value({"extra": {"note": f"[{value}]"}}) == {"extra": {"note": f"[{REDACTED}]"}}
        assert redact_text("short story") == "short story"  # too short to be registered
    finally:
        forget_secret_values([value])
    assert redact_text(text) == text


def test_json_arguments_stay_valid_json_with_the_same_structure(injected):
    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shape(v) for v in value]
        return type(value).__name__

    checked = 0
    for case, field, events in corpus_sessions(CASES):
        if field not in ("command", "arguments", "file_content"):
            continue
        for event in events:
            if event["event_type"] != "agent_action":
                continue
            redacted = redact_value(event)["payload"]["arguments"]
            before, after = json.loads(event["payload"]["arguments"]), json.loads(redacted)
            assert shape(after) == shape(before), case.kind
            assert leaks(case, [after]) == [], case.kind
            checked += 1
    assert checked == 3 * len(CASES)


def test_secret_named_keys_redact_their_values_and_ordinary_keys_do_not():
    value = {
        "password": "hunter2",
        "config": {"api_key": "q8Zt3kLm9PvX", "client_secret": "abc123def456", "SessionToken": "tok3n"},
        "author_name": "Tom Forbes",
        "new_tokens": "[]",
        "max_tokens": 1024,
        "password_validators": "default",
        "token": "",
    }
    redacted = redact_value(value)
    assert redacted["password"] == REDACTED and redacted["config"]["api_key"] == REDACTED
    assert redacted["config"]["client_secret"] == REDACTED and redacted["config"]["SessionToken"] == REDACTED
    assert {k: redacted[k] for k in ("author_name", "new_tokens", "max_tokens", "password_validators", "token")} == {
        k: value[k] for k in ("author_name", "new_tokens", "max_tokens", "password_validators", "token")
    }
    text = json.dumps(value)
    assert json.loads(redact_json_text(text)) == redacted  # the same, whether parsed or given as JSON text


@pytest.mark.parametrize(
    "name, secret",
    [
        ("DB_PASS", True),
        ("GITHUB_TOKEN", True),
        ("SecretAccessKey", True),
        ("private_key_id", True),
        ("X-Api-Key", True),
        ("PGPASSWORD", True),
        ("AccountKey", True),
        ("auth", True),
        ("author_name", False),
        ("Author", False),
        ("new_tokens", False),
        ("password_validators", False),
        ("TL_SECRETS_FILE", False),
        ("STORAGE_KEY", False),
        ("key", False),
        ("tokenizer", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    "text",
    [
        "basic functionality",
        "Author: Tom Forbes <tom@example.com>",
        "author_name='Tom Forbes', author_email='tom@example.com'",
        "        new_tokens = []\n        for token in tokens:",
        "token = cast(MetaSegment, token)",
        "self.password = password",
        "password_validators=[]",
        "SECRET_KEY='test-secret-key',",
        "User.objects.create_user(username='testclient', password='password')",
        "the tokenizer counts tokens; Bearer tokens are documented in RFC 6750",
        "risk-assessment-framework-version-2024",
        "git log --author='Tom' -p -- src/auth.py",
        "const STORAGE_KEY = 'vue-todomvc'",
    ],
)
def test_ordinary_text_is_untouched(text):
    assert redact_text(text) == text
    assert redact_json_text(json.dumps({"command": text})) == json.dumps({"command": text})


def test_redaction_is_idempotent(injected):
    for case in CASES:
        once = redact_json_text(case.text)
        assert redact_json_text(once) == once, case.kind


def test_column_redaction_matches_value_redaction(injected):
    texts = [case.text for case in CASES] + ["ls -la", None, "", "x" * 5000 + " Authorization: Bearer abc123def456"]
    redacted = redact_array(pa.array(texts)).to_pylist()
    assert redacted == [redact_json_text(t) if t is not None else None for t in texts]
    assert all(not leaks(case, [out]) for case, out in zip(CASES, redacted, strict=False))


def test_clean_events_pass_through_untouched_and_mostly_uncopied():
    events = sample_events(20)
    assert all(redact_value(event) == event for event in events)
    # the fast path: an event without any trigger literal is returned itself, not rebuilt
    assert sum(redact_value(event) is event for event in events) > 0.9 * len(events)


def test_deep_json_is_redacted_by_text_rules_and_deep_values_are_refused():
    secret = "gh" + "p_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    deep = json.dumps({"a": [[[[[[{"b": [secret]}]]]]]]})
    for depth in (10, MAX_DEPTH + 50, 3000):
        text = "[" * depth + deep + "]" * depth
        out = redact_json_text(text)
        bare = out.replace(REDACTED, "")
        assert secret not in out and bare.count("[") == text.count("[") and bare.count("]") == text.count("]")
        if depth < 900:  # deeper than Python's json can read back
            assert json.loads(out) is not None
    nested: object = {"password": "hunter2x"}
    for _ in range(MAX_DEPTH + 10):
        nested = {"x": nested}
    with pytest.raises(RedactionError):
        redact_value(nested)


@pytest.fixture(scope="module")
def real():
    if not real_run_files(REAL_RUNS_DIR):
        pytest.skip(f"no recorded real runs at {REAL_RUNS_DIR}")
    runs, skipped = real_runs(REAL_RUNS_DIR)
    assert not skipped
    return runs


def test_real_runs_are_unchanged_zero_false_positives(real):
    changed = [
        (e["session_id"], e["seq"]) for events in real for e in events if redact_value(e) != e
    ]  # the runs hold no secret: any change is a false positive
    assert changed == []
    texts = "\n".join(strings_of(real))
    assert "new_tokens = []" in texts and "Author: Karel De Brabandere" in texts  # what the old redactor damaged


def test_every_string_recorded_in_the_real_runs_is_unchanged(real):
    strings = real_run_strings(REAL_RUNS_DIR)
    changed = [s[:200] for s in strings if redact_json_text(s) != s]
    assert changed == []
    text = "\n".join(strings)
    # lookalikes of secrets in their code and prose, which the old redactor rewrote
    for ordinary in (
        "SECRET_KEY='test-secret-key'",
        "STORAGE_KEY = 'vue-todo-list'",
        "password='password'",
        "# Basic Validation",
        "author=",
        "author_email=",
    ):
        assert ordinary in text


def test_submitted_patches_survive_byte_identical(real):
    patches = [t for t in strings_of(real) if t.startswith("diff --git")]
    assert patches
    assert all(redact_json_text(p) == p for p in patches)


@pytest.mark.slow
def test_import_redacts_a_recorded_run_holding_secrets(tmp_path: Path, injected):
    source = REAL_RUNS_DIR / "mini-swe-agent" / "django__django-11099.traj.json"
    if not source.is_file():
        pytest.skip(f"no recorded real run at {source}")
    from producers.importers import import_paths, import_trajectory

    run = json.loads(source.read_text())
    hosts = [m for m in run["messages"] if m["role"] in ("assistant", "tool", "user") and isinstance(m["content"], str)]
    assert len(hosts) >= 3
    for i, case in enumerate(CASES):  # every case in some message's content, spread over the run
        message = hosts[i % len(hosts)]
        if "</output>" in message["content"]:  # a tool result: inside its <output>, which is what is kept
            message["content"] = message["content"].replace("</output>", "\n" + case.text + "</output>", 1)
        else:
            message["content"] += "\n" + case.text
    path = tmp_path / "leaky.traj.json"
    path.write_text(json.dumps(run))
    raw = import_trajectory(path, redact=False)
    assert all(leaks(case, raw) for case in CASES)  # they did go into events
    events = import_trajectory(path)
    assert {case.kind: leaks(case, events) for case in CASES if leaks(case, events)} == {}
    producer, sent = _capturing_producer()
    import_paths([path], producer.emit)  # what `trajlake import` does, minus Kafka
    decoded = [decode_event(value) for value in sent]
    assert len(decoded) == len(events)
    assert {case.kind: leaks(case, decoded) for case in CASES if leaks(case, decoded)} == {}


@pytest.mark.slow
def test_export_removes_secrets_that_bypassed_the_producer(tmp_path: Path, injected):
    from common.settings import load_settings
    from pipelines.assemble import assemble
    from pipelines.export import FORMATS, export_training_set
    from pipelines.score import score_all
    from producers.fleet import run_fleet
    from tests.helpers import write_raw

    settings = load_settings(home=tmp_path / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None)
    events: list[dict] = []
    run_fleet(settings, backend="synthetic", sessions=12, seed=11, cheat_rate=0.0, sink=events.append)
    everything = "\n".join(case.text for case in CASES)
    for n, event in enumerate(events):  # every case in every instruction, and rotating through the steps
        payload = event["payload"]
        if event["event_type"] == "session_start":
            payload["instruction"] = (payload.get("instruction") or "") + "\n" + everything
        elif event["event_type"] == "agent_action":
            payload["thought"] = (payload.get("thought") or "") + "\n" + CASES[n % len(CASES)].text
            arguments = json.loads(payload["arguments"])
            arguments["env"] = CASES[(n + 1) % len(CASES)].text
            payload["arguments"] = json.dumps(arguments)
        elif event["event_type"] == "env_feedback":
            payload["output"] = (payload.get("output") or "") + "\n" + CASES[(n + 2) % len(CASES)].text
    write_raw(settings, events, batch_size=5000)  # straight into raw events: no producer, no redaction
    assemble(Lakehouse.open(settings))
    assert score_all(Lakehouse.open(settings)).exportable > 0
    for fmt in (f for f in FORMATS if f not in ("verl", "skyrl")):  # trainer records need token ids: none here
        out = tmp_path / f"out-{fmt}"
        stats = export_training_set(Lakehouse.open(settings), fmt, out, filters=ALL_ORIGINS)
        assert stats.records > 0
        text = "".join(path.read_text() for path in sorted((out / "data").iterdir()))
        records = [json.loads(line) for line in text.splitlines()]
        assert REDACTED in text
        left = {
            case.kind: leaks(case, records) for case in CASES if leaks(case, records) or leaks(case, [{"export": text}])
        }
        assert left == {}, fmt


def _transforms_of(value: str) -> dict[str, str]:
    """The reversible transforms of ``value`` the redactor covers (see docs/guarantees.md, Secrets)."""
    import base64
    import codecs

    raw = value.encode()
    return {
        "plain": value,
        "reversed": value[::-1],
        "upper": value.upper(),
        "rot13": codecs.encode(value, "rot13"),
        "hex": raw.hex(),
        # base64 of the value in each alignment a longer stream can put it in (the value's middle)
        **{f"base64+{n}": base64.b64encode(b"x" * n + raw).decode()[4:-4] for n in range(3)},
    }


def test_local_fleet_injected_task_token_never_leaves_the_host(settings, tmp_path, monkeypatch):
    """The sink sees what leaves the host: the task token is in no event, in no transform the redactor covers."""
    from producers import redact
    from producers.fleet import ListSink, agents, local_session, run_fleet
    from producers.fleet.sandbox import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap cannot create sandboxes here")
    registered: list[str] = []
    real_register = local_session.register_secret_values

    def register(values):
        values = list(values)
        registered.extend(values)
        real_register(values)

    def leak(ctx):
        secret = "/run/secrets/task.env"
        ctx.bash(f"cut -d= -f2 {secret}", "Print the task token alone.")
        ctx.bash(f"cat {secret}; rev {secret} | rev", "And the whole file.")
        ctx.bash(f"rev {secret}; tr a-f A-F < {secret}; tr a-z n-za-m < {secret}", "Reversed, upper case, ROT13.")
        ctx.bash(f"od -An -tx1 {secret} | tr -d ' \\n'; echo; cut -d= -f2 {secret} | tr -d '\\n' | od -An -tx1", "Hex.")
        for skip in range(3):
            ctx.bash(f"(head -c {skip} /dev/zero; cut -d= -f2 {secret}) | base64 -w 0", "Base64, shifted.")
        ctx.bash(f"cut -d= -f2 {secret} | fold -w 5; base64 -w 7 {secret}", "Broken over lines.")
        ctx.write_file("leak.txt", "token: " + ctx.sandbox.run(f"cut -d= -f2 {secret}").output, "In a file too.")
        ctx.read_file("leak.txt", "Read it back.")
        # a secret whose name is in one output and its value in the next: only cross-event state sees it
        ctx.bash("printf 'export DEPLOY_TOKEN='", "The name, at the end of one output.")
        ctx.bash(f"sha256sum {secret} | cut -c1-32 | tr -d '\\n'", "A value made in the sandbox, in the next.")
        return agents.AgentOutcome("gave_up", "fail")

    monkeypatch.setattr(local_session, "register_secret_values", register)
    monkeypatch.setitem(agents.POLICIES, "leak", leak)
    sink = ListSink()
    producer, sent = _capturing_producer()

    class Both(ListSink):
        def emit(self, event):
            sink.emit(json.loads(json.dumps(event)))
            return producer.emit(event)

    run_fleet(settings, "local", 1, seed=3, sink=Both(), policy_mix={"leak": 1.0}, labels_path=tmp_path / "l.jsonl")
    assert len(registered) == 1
    token = registered[0]
    outputs = [e["payload"]["output"] for e in sink.events if e["event_type"] == "env_feedback"]
    assert sum(REDACTED in out for out in outputs) >= 8  # every printing command was redacted
    decoded = [decode_event(value) for value in sent]
    assert len(decoded) == len(sink.events)
    texts = list(strings_of(sink.events)) + list(strings_of(decoded))
    texts += [re.sub(r"\s+", "", t) for t in texts]  # folded, one character per line
    for name, form in _transforms_of(token).items():
        assert not any(form in text for text in texts), f"the token leaves the host {name}"
        assert not any(form.lower() in text.lower() for text in texts if name == "hex"), "hex, either case"
    derived = hashlib.sha256(f"TL_TASK_TOKEN={token}\n".encode()).hexdigest()[:32]
    assert not any(derived in text for text in texts), "the value after a name in the previous output"
    assert token not in redact._secret_values  # forgotten once the session's events are out


@pytest.mark.slow
def test_bench_redaction_prints_recall_false_positives_and_cost():
    from typer.testing import CliRunner

    from trajlake.cli import app

    result = CliRunner().invoke(
        app, ["bench", "redaction", "--no-detect-secrets", "--no-public", "--real", str(REAL_RUNS_DIR)]
    )
    assert result.exit_code == 0, result.output
    labels = ("recall overall", "FP redactions", "FP in run files", "us/event", "vs encode")
    figures = {
        label: line[len(label) :].split()
        for line in result.output.splitlines()
        for label in labels
        if line.startswith(label)
    }
    assert float(figures["recall overall"][0]) == 1.0
    kinds = {case.kind for case in CASES}
    assert {line.split()[0] for line in result.output.splitlines() if line.split()[-1:] == ["1.00"]} >= kinds
    if not real_run_files(REAL_RUNS_DIR):  # false positives and cost are measured on the recorded runs
        pytest.skip(f"recall checked; false positives and cost need the recorded real runs at {REAL_RUNS_DIR}")
    assert figures["FP redactions"] == ["0"] and figures["FP in run files"] == ["0"]
    assert float(figures["us/event"][0]) > 0 and figures["vs encode"][0].endswith("x")
