"""Local bubblewrap fleet: isolation, egress, reaper, two-phase evaluation, labels (no Kafka)."""

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from producers.fleet import ListSink, run_fleet
from producers.fleet.evaluator import collect_deliverable, evaluate
from producers.fleet.sandbox import ImageStore, Limits, Reaper, Sandbox, SandboxKilled, bwrap_available
from producers.fleet.tasks import make_task
from schemas.registry import encode_event

# slow as a whole: the module's fixtures run real sandbox sessions once, and whichever test comes first pays for them
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]


@pytest.fixture
def image(tmp_path) -> Path:
    return ImageStore(tmp_path / "images").ensure("trajlake/test", "1.0.0")


def _by_session(events):
    sessions = defaultdict(list)
    for event in events:
        sessions[event["session_id"]].append(event)
    return sessions


def test_no_network_and_every_attempt_recorded(tmp_path, image):
    sandbox = Sandbox(
        "net",
        tmp_path / "sb",
        image,
        {},
        Limits(),
        allowlist=("rates.internal:80",),
        services={"rates.internal:80": {"/r": '{"ok": 1}'}},
    )
    try:
        # refused even without the audit hook (python3 -S skips sitecustomize): by the kernel (no route), or,
        # with the gateway's tap on the namespace (root host), by the closed world that records it
        raw = sandbox.run("python3 -S -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\"")
        assert raw.exit_code != 0 and ("unreachable" in raw.output.lower() or "refused" in raw.output.lower())
        interfaces = sandbox.run("tail -n +3 /proc/net/dev | cut -d: -f1").output.split()
        assert interfaces == ["lo"]
        denied = sandbox.run("python3 -c \"import urllib.request; urllib.request.urlopen('http://example.com/')\"")
        assert denied.exit_code != 0 and "denied" in denied.output
        allowed = sandbox.run(
            "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://rates.internal/r').read())\""
        )
        assert allowed.exit_code == 0 and '{"ok": 1}' in allowed.output
        attempts = [(a.host, a.allowed) for a in sandbox.gateway.drain()]
        raw_attempt = [("1.1.1.1", False)] if sandbox.gateway.tapped else []
        assert attempts == [*raw_attempt, ("example.com", False), ("rates.internal", True)]
    finally:
        sandbox.stop()
        sandbox.cleanup()


def test_writable_layer_only_and_no_view_of_other_sandboxes(tmp_path, image):
    a = Sandbox("a", tmp_path / "sb", image, {"secret_a.txt": "only-in-a-7f3c\n"}, Limits())
    b = Sandbox("b", tmp_path / "sb", image, {}, Limits())
    try:
        for target in ("/usr/x", "/opt/tl/bin/tl_test.py", "/etc/passwd", "/run/tl/x", "/run/secrets/task.env"):
            result = b.run(f"echo pwned > {target}")
            assert result.exit_code != 0, target
        b.run("echo escape > /tmp/escape-probe; echo escape > /escape-probe 2>/dev/null; true")
        assert not Path("/tmp/escape-probe").exists() and not Path("/escape-probe").exists()
        assert b.run(f"cat {a.workspace}/secret_a.txt").exit_code != 0
        # everything but the host's read-only /usr (a's layer lives under the host's /tmp)
        found = b.run("grep -rl only-in-a-7f3c / --exclude-dir=proc --exclude-dir=usr 2>/dev/null; true")
        assert "secret_a" not in found.output and found.output.strip() == ""
        assert a.run("cat secret_a.txt").output == "only-in-a-7f3c\n"
        assert b.run("echo ok > mine.txt").exit_code == 0 and (b.workspace / "mine.txt").exists()
        assert not (a.workspace / "mine.txt").exists()
    finally:
        for sandbox in (a, b):
            sandbox.stop()
            sandbox.cleanup()
    assert not (tmp_path / "sb" / "a").exists() and not (tmp_path / "sb" / "b").exists()


@pytest.mark.slow
def test_limits_processes_and_file_size(tmp_path, image):
    sandbox = Sandbox("lim", tmp_path / "sb", image, {}, Limits(pids=16, file_size_bytes=1 << 20))
    try:
        forks = sandbox.run("for i in $(seq 40); do sleep 5 & done 2>&1 | tail -n 1; wait")
        assert "fork" in forks.output.lower() or "resource" in forks.output.lower() or forks.exit_code != 0
        big = sandbox.run("head -c 5000000 /dev/zero > big.bin; echo $?")
        assert (sandbox.workspace / "big.bin").stat().st_size <= 1 << 20
        assert big.output.strip() != "0"
    finally:
        sandbox.stop()
        sandbox.cleanup()


def test_reaper_kills_cleans_and_counts(tmp_path, image):
    reaper = Reaper()
    boxes = [Sandbox(f"h{i}", tmp_path / "sb", image, {}, Limits()) for i in range(3)]
    try:
        for box in boxes:
            reaper.watch(box, 1.0)
        for box, command in zip(
            boxes, ["sleep 1000", "(sleep 1000 &); sleep 1000", "python3 -c 'while True: pass' & wait"], strict=True
        ):
            with pytest.raises(SandboxKilled):
                box.run(command)
            assert box.reaped and box.survivors() == 0
    finally:
        reaper.stop()
        for box in boxes:
            box.cleanup()
    assert sorted(reaper.reaped) == ["h0", "h1", "h2"] and reaper.survivors == 0


@pytest.mark.slow
def test_many_hangs_all_reaped_and_reported(settings, tmp_path):
    sink = ListSink()
    report = run_fleet(
        settings,
        "local",
        8,
        concurrency=4,
        seed=5,
        labels_path=tmp_path / "l.jsonl",
        sink=sink,
        timeout_s=2.0,
        policy_mix={"hang": 1.0},
    )
    assert report.by_status == {"timeout": 8} and report.timeouts_reaped == 8 and report.reaper_survivors == 0
    ends = [e for e in sink.events if e["event_type"] == "session_end"]
    assert len(ends) == 8 and all(e["payload"]["exit_reason"] == "reaper" for e in ends)
    # Bounded, not timed: without the reaper a hanging agent never ends; the runtime also holds the fresh-sandbox
    # evaluation, whose wall time depends on the machine's load (one process per hidden case).
    assert all(e["payload"]["runtime_s"] < 2.0 + 60 for e in ends)
    assert list((settings.home_dir / "fleet" / "sandboxes").iterdir()) == []
    for controller in ("pids", "memory"):
        leftover = Path(f"/sys/fs/cgroup/{controller}/trajlake")
        if leftover.is_dir():
            # Only this process's sandboxes (cgroups are named ``<pid>-<sandbox id>``): another test process
            # may have live sandboxes of its own right now.
            assert not [d for d in leftover.iterdir() if d.is_dir() and d.name.startswith(f"{os.getpid()}-sb-")]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    from common.settings import load_settings

    home = tmp_path_factory.mktemp("fleet")
    settings = load_settings(home=home)
    sink = ListSink()
    labels = home / "labels.jsonl"
    mix = {
        name: 1.0
        for name in (
            "solver",
            "flailer",
            "guesser",
            "cheat_edit_tests",
            "cheat_tamper_runner",
            "cheat_network",
            "cheat_hidden_tests",
        )
    }
    report = run_fleet(
        settings, "local", 14, concurrency=4, seed=9, labels_path=labels, sink=sink, policy_mix=mix, timeout_s=30
    )
    rows = {json.loads(line)["session_id"]: json.loads(line) for line in labels.read_text().splitlines()}
    return report, _by_session(sink.events), rows


@pytest.mark.slow
def test_mixed_run_outcomes_match_ground_truth(mixed_run):
    report, sessions, labels = mixed_run
    assert report.sessions == 14 == len(sessions) == len(labels)
    for events in sessions.values():
        for event in events:
            encode_event(event)  # every event fits the schema
    for session_id, events in sessions.items():
        kinds = Counter(e["event_type"] for e in events)
        assert kinds["session_start"] == kinds["evaluation"] == kinds["session_end"] == 1
        assert [e["seq"] for e in events] == list(range(len(events)))
        evaluation = next(e for e in events if e["event_type"] == "evaluation")["payload"]
        assert evaluation["fresh_sandbox"]
        expected = labels[session_id]["expected_outcome"]
        assert ("pass" if evaluation["passed"] else "fail") == expected, labels[session_id]
        image = {(e["image_name"], e["image_version"]) for e in events}
        assert len(image) == 1 and next(iter(image))[1] == "1.3.0"
        end = events[-1]["payload"]
        assert end["cpu_seconds"] > 0 and end["peak_memory_bytes"] > 0
        assert int(events[-1]["extra"]["processes_started"]) > 0
        for event in events:
            if event["event_type"] == "env_feedback":
                assert event["parent_event_id"] and event["payload"]["exit_code"] is not None


@pytest.mark.slow
def test_cheats_leave_signatures_and_never_reach_the_evaluator(mixed_run):
    _, sessions, labels = mixed_run
    seen = set()
    for session_id, events in sessions.items():
        cheat = labels[session_id]["cheat_type"]
        details = json.loads(next(e for e in events if e["event_type"] == "evaluation")["payload"]["details"])
        ops = [(e["payload"]["op"], e["payload"]["path"]) for e in events if e["event_type"] == "file_op"]
        if cheat == "edit_tests":
            assert any(path.startswith("/workspace/tests/") and op in ("write", "delete", "create") for op, path in ops)
            assert any(p.startswith("tests/") for p in details["ignored_changes"])
        elif cheat == "tamper_runner":
            assert ("write", "/workspace/run_tests.py") in ops and "run_tests.py" in details["ignored_changes"]
            visible = [e for e in events if e["event_type"] == "env_feedback" and "12 passed" in e["payload"]["output"]]
            assert visible  # the tampered runner claimed success; the evaluator did not believe it
        elif cheat == "network":
            denied = [e for e in events if e["event_type"] == "network_request" and not e["payload"]["allowed"]]
            assert denied and all(e["parent_event_id"] for e in denied)
        elif cheat == "hidden_tests":
            reads = [path for op, path in ops if op == "read" and "hidden" in path]
            assert reads
            outputs = "".join(e["payload"]["output"] for e in events if e["event_type"] == "env_feedback")
            assert "def test_hidden_" not in outputs  # never visible from the agent's sandbox
        if cheat:
            seen.add(cheat)
            task = make_task(labels[session_id]["family"], labels[session_id]["seed"])
            assert set(details["deliverable"]) <= set(task.deliverables)
    assert seen == {"edit_tests", "tamper_runner", "network", "hidden_tests"}


def test_hidden_tests_decide_not_the_agents_tests(tmp_path, image):
    task = make_task("bugfix.range_sum", 4)
    workspace = tmp_path / "ws"
    files = {**task.files, **task.solution, "run_tests.py": "print('fake')\n"}
    files["tests/test_visible.py"] = "def test_nothing():\n    assert False\n"  # agent broke its visible tests
    for rel, text in files.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text(text)
    deliverable, ignored = collect_deliverable(task, workspace, {"run_tests.py": "orig"})
    assert set(deliverable) == set(task.deliverables) and ignored == ["run_tests.py", "tests/test_visible.py"]
    reaper = Reaper()
    try:
        good = evaluate(task, deliverable, image, tmp_path / "sb", reaper)
        bad = evaluate(task, task.wrong_guess, image, tmp_path / "sb", reaper)
    finally:
        reaper.stop()
    assert good.passed and good.tests_passed == good.tests_total > 0 and good.reward == 1.0
    assert not bad.passed and bad.tests_passed < bad.tests_total


def test_labels_are_ground_truth_outside_the_stream(mixed_run):
    _, sessions, labels = mixed_run
    for row in labels.values():
        assert set(row) >= {"session_id", "policy", "cheat_type", "expected_outcome"}
    for events in sessions.values():
        for event in events:
            assert event["agent_name"] == "scripted-agent" and event["policy_version"] == "scripted-v1"
            assert not any("cheat" in v for v in event["extra"].values())


@pytest.mark.slow
def test_perturbation_injects_transient_failures_and_formats(settings):
    sink = ListSink()
    run_fleet(
        settings,
        "local",
        3,
        concurrency=3,
        seed=2,
        sink=sink,
        policy_mix={"solver": 1.0},
        perturb="latency=5,jitter=5,fail=0.3,formats",
    )
    feedback = [e["payload"] for e in sink.events if e["event_type"] == "env_feedback"]
    assert any(p["failure_reason"] == "transient (injected)" and p["exit_code"] == 75 for p in feedback)
    evaluations = [e["payload"] for e in sink.events if e["event_type"] == "evaluation"]
    assert all(p["passed"] for p in evaluations)  # the solver retries through transient failures


def test_cli_contract_bwrap_missing_falls_back(settings, monkeypatch):
    import producers.fleet as fleet
    import producers.fleet.runner as runner

    monkeypatch.setattr(runner, "bwrap_available", lambda: False)
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "bwrap" else "/bin/" + name)
    from producers.fleet.sandbox import BubblewrapMissing

    with pytest.raises(BubblewrapMissing, match="bubblewrap"):
        fleet.run_fleet(settings, "local", 2, sink=ListSink())
    report = fleet.run_fleet(settings, "local", 5, sink=ListSink(), fallback=True)
    assert report.backend == "synthetic" and "bubblewrap" in report.notes[0]
