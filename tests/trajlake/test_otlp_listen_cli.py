"""``trajlake import --listen`` end to end: a conversation id that looks like console markup is printed as text and
the receiver goes on sending the next conversation; a non-loopback address without a token is refused in one line."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from common.broker import ensure_topic, free_port
from tests.producers.importers.test_otlp_receiver import trace_body

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _env(tmp_path: Path, bootstrap: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    topic = f"listen-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, 1)
    env.update(TRAJLAKE_HOME=str(tmp_path / "home"), TRAJLAKE_KAFKA_BOOTSTRAP=bootstrap, TRAJLAKE_TOPIC=topic)
    return env


def _stopped(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for ``process`` to exit after a stop signal; killed (and the test failed) if it does not within 60 s."""
    try:
        return process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError("the listener did not stop within 60 s of its stop signal") from None


def test_markup_in_a_conversation_id_is_printed_as_text_and_nothing_stops(tmp_path: Path, tansu_broker: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "trajlake.cli", "import", "--listen", f"127.0.0.1:{port}"]
    with subprocess.Popen(
        command, env=_env(tmp_path, tansu_broker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        printed: queue.Queue[str] = queue.Queue()
        stdout = process.stdout

        def pump() -> None:
            for line in stdout:
                printed.put(line)

        threading.Thread(target=pump, daemon=True).start()
        try:
            assert "receiving OTLP/HTTP traces" in printed.get(timeout=60)
            lines = []
            for conversation in ["[/][bold]evil\x1b[31m", "plain"]:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/traces",
                    data=trace_body(conversation),
                    headers={"Content-Type": "application/x-protobuf"},
                )
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
                lines.append(printed.get(timeout=60))  # the receiver prints each session it sent (none: it died)
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = _stopped(process)
    assert "conversation:[/][bold]evil\\u001b[31m: session" in lines[0], lines
    assert "conversation:plain: session" in lines[1], lines
    assert "MarkupError" not in stderr and "Traceback" not in stderr, stderr


def test_a_non_loopback_address_without_a_token_is_refused_in_one_line(tmp_path: Path, tansu_broker: str) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "import", "--listen", "0.0.0.0:0"],
        env=_env(tmp_path, tansu_broker),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "TRAJLAKE_OTLP_TOKEN" in errors[0], result.stderr
    assert time.monotonic() - started < 60


def test_a_credentials_file_others_can_read_is_refused_in_one_line(tmp_path: Path, tansu_broker: str) -> None:
    """``TRAJLAKE_OTLP_TOKENS_FILE`` reaches the receiver: a file readable by others stops it before it listens."""
    clients = tmp_path / "otlp-clients"
    clients.write_text("alpha:" + "a" * 20 + "\n")
    clients.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "import", "--listen", "0.0.0.0:0"],
        env={**_env(tmp_path, tansu_broker), "TRAJLAKE_OTLP_TOKENS_FILE": str(clients)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "readable by others" in errors[0] and "aaaa" not in result.stderr, result.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("signum", "started_ignoring_sigint"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigterm", "sigint-from-a-background-shell"],
)
def test_the_listener_stops_on_sigterm_and_on_sigint_it_inherited_ignored(
    tmp_path: Path, tansu_broker: str, signum: signal.Signals, started_ignoring_sigint: bool
) -> None:
    """A supervisor stops with SIGTERM; a shell's background job inherits SIGINT ignored (no KeyboardInterrupt)."""
    port = free_port()
    command = [sys.executable, "-m", "trajlake.cli", "import", "--listen", f"127.0.0.1:{port}"]
    with subprocess.Popen(
        command,
        env=_env(tmp_path, tansu_broker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if started_ignoring_sigint else None,
    ) as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "receiving OTLP/HTTP traces" in first, first
        process.send_signal(signum)
        rest, stderr = _stopped(process)
    assert process.returncode == 0, stderr
    assert "received 0 spans, sent 0 sessions" in rest and "Traceback" not in stderr, (rest, stderr)
