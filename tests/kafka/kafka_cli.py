"""Command line of the real Kafka broker used by the integration tests (``scripts/kafka.sh`` runs it).

Usage::

    python tests/kafka/kafka_cli.py build
    python tests/kafka/kafka_cli.py run --dir DIR     # blocks until Ctrl-C
    python tests/kafka/kafka_cli.py start --dir DIR   # detached, pid file
    python tests/kafka/kafka_cli.py stop --dir DIR
    python tests/kafka/kafka_cli.py status --dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kafka_classpath import KafkaServerError, ensure_classpath
from kafka_server import DEFAULT_START_TIMEOUT, KafkaServer


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point.

    Sub-commands: ``build`` (cache the classpath only), ``run --dir D`` (start,
    print the bootstrap address, block until Ctrl-C/SIGTERM, then stop),
    ``start --dir D`` (start detached, write ``D/kafka.pid``, print the
    bootstrap address), ``stop --dir D`` and ``status --dir D``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(
        prog="kafka_cli.py", description="A single-node Apache Kafka broker (KRaft) for tests."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build and cache the Kafka classpath")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    for name, text in (
        ("run", "start in the foreground; Ctrl-C stops"),
        ("start", "start detached (pid file in DIR)"),
        ("stop", "stop the broker of DIR"),
        ("status", "print bootstrap and state of DIR"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, type=Path, help="data directory")
        if name in ("run", "start"):
            cmd.add_argument("--timeout", type=float, default=DEFAULT_START_TIMEOUT, help="readiness timeout (s)")
            cmd.add_argument("--port", type=int, default=None, help="broker port (default: free/previous)")
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            print(ensure_classpath(force=args.force))
            return 0
        server = KafkaServer(args.dir, broker_port=getattr(args, "port", None))
        if args.command == "start":
            if not server.is_running():
                server.start(args.timeout)
            print(server.bootstrap, flush=True)
            return 0
        if args.command == "stop":
            server.stop()
            return 0
        if args.command == "status":
            print(f"{server.bootstrap} {'running' if server.is_running() else 'stopped'}")
            return 0 if server.is_running() else 3
        with _sigterm_as_interrupt():
            try:
                server.start(args.timeout)
                print(server.bootstrap, flush=True)
                while server.is_running():
                    time.sleep(0.5)
                print(f"Kafka exited unexpectedly\n{server.log_tail()}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                return 0
            finally:
                server.stop()
    except KafkaServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
