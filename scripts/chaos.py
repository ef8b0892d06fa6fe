"""Chaos run: SIGKILL ingest workers at random moments and check exactly-once at the end.

Produces ``--events`` events (plus a few poison records) to a fresh topic on
real Apache Kafka (started here from the Maven-built classpath unless
``--bootstrap`` is given), then runs rounds of ingest processes, one or two
per consumer group (two make a rebalance happen mid-run), and SIGKILLs each
after a random delay: during start-up, mid-batch, mid-write or between the
Iceberg commit and the Kafka offset commit. A last clean run drains the rest.
The result compares ``count(*)`` and ``count(DISTINCT event_id)`` of
``events`` and the dead letters with what was produced.

Usage::

    .venv/bin/python scripts/chaos.py --events 1000000 --kills 200
    .venv/bin/python scripts/chaos.py --events 100000 --kills 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "kafka")]

POISON = [b"", b"\x00not avro", b"\xc3\x01" + b"\x11" * 8 + b"unknown fingerprint", b"\xc3\x01truncated"]


@dataclass
class ChaosResult:
    """What one chaos run produced, killed and found at the end."""

    events: int
    poison: int
    kills: int
    rows: int
    distinct_event_ids: int
    dead_letters: int
    lost: int
    duplicated: int
    seconds: float

    @property
    def exactly_once(self) -> bool:
        """Every event landed once and every poison record is a dead letter."""
        return self.lost == 0 and self.duplicated == 0 and self.dead_letters == self.poison


def event_stream(count: int, seed: int) -> Iterator[dict[str, Any]]:
    """``count`` realistic events: synthetic sessions cloned under fresh session and event ids."""
    from producers.session_generator import synthetic_sessions

    rng = random.Random(seed)
    templates = list(synthetic_sessions(12, seed=seed, start_us=1_767_225_600_000_000))
    emitted = 0
    while emitted < count:
        session = templates[rng.randrange(len(templates))]
        session_id = uuid.UUID(int=rng.getrandbits(128)).hex
        for event in session:
            if emitted == count:
                return
            yield {**event, "session_id": session_id, "event_id": uuid.UUID(int=rng.getrandbits(128)).hex}
            emitted += 1


def produce_events(bootstrap: str, topic: str, count: int, seed: int) -> int:
    """Send ``count`` events and the poison records; returns the number of poison records."""
    from producers.sdk import EventProducer

    producer = EventProducer(bootstrap, topic, "chaos-host", redact=False)
    for event in event_stream(count, seed):
        producer.emit(event)
    for i, value in enumerate(POISON):
        producer.send(f"poison-{i}", f"poison-{i}", value)
    producer.flush(300)
    return len(POISON)


def _ingest(env: dict[str, str], group: str, until_idle: float | None) -> subprocess.Popen[bytes]:
    args = ["ingest", "--until-idle", str(until_idle)] if until_idle is not None else ["ingest", "--follow"]
    return subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", *args],
        env={**env, "TRAJLAKE_CONSUMER_GROUP": group},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def count_rows(env: dict[str, str]) -> tuple[int, int, int]:
    """``count(*)``, ``count(DISTINCT event_id)`` of events and ``count(*)`` of dead letters."""
    from common.settings import load_settings
    from warehouse.query import run_query

    settings = load_settings(home=Path(env["TRAJLAKE_HOME"]), topic=env["TRAJLAKE_TOPIC"])
    rows = run_query(
        settings,
        "SELECT (SELECT count(*) FROM events), (SELECT count(DISTINCT event_id) FROM events), "
        "(SELECT count(*) FROM dead_letters)",
    )[1]
    return rows[0]


def run_chaos(
    bootstrap: str,
    home: Path,
    events: int,
    kills: int,
    seed: int = 0,
    max_rows: int = 2000,
    partitions: int = 4,
    min_delay: float = 3.0,
    max_delay: float = 8.0,
    log: Any = print,
) -> ChaosResult:
    """Produce, ingest under ``kills`` random SIGKILLs, drain cleanly, count.

    Args:
        bootstrap: Kafka bootstrap servers.
        home: TRAJLAKE_HOME of the run (a fresh directory).
        events: events to produce.
        kills: ingest processes to SIGKILL.
        seed: seeds the events and the kill schedule.
        max_rows: TRAJLAKE_INGEST_MAX_ROWS, small so batches commit often.
        partitions: partitions of the topic.
        min_delay, max_delay: how long a worker lives before its SIGKILL, in seconds (start-up takes ~2-3 s).
        log: progress printer.
    """
    from common.broker import ensure_topic

    started = time.monotonic()
    rng = random.Random(seed)
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(
        TRAJLAKE_HOME=str(home),
        TRAJLAKE_KAFKA_BOOTSTRAP=bootstrap,
        TRAJLAKE_TOPIC=topic,
        TRAJLAKE_INGEST_MAX_ROWS=str(max_rows),
        TRAJLAKE_INGEST_MAX_SECONDS="1",
        PYTHONPATH=str(ROOT),
    )
    poison = produce_events(bootstrap, topic, events, seed)
    log(f"produced {events} events + {poison} poison records to {topic} in {time.monotonic() - started:.1f} s")
    killed = 0
    round_no = 0
    while killed < kills:
        round_no += 1
        # A fresh group per round: a SIGKILLed member would hold its partitions for the session
        # timeout otherwise. Ingest resumes from the offsets in Iceberg, not from the group's.
        group = f"chaos-{round_no}"
        pair = rng.random() < 0.3 and kills - killed >= 2
        workers = [_ingest(env, group, None)]
        if pair:  # a second member joins late: a rebalance while the first is mid-batch
            time.sleep(rng.uniform(0.5, 2.5))
            workers.append(_ingest(env, group, None))
        for worker in workers:
            time.sleep(rng.uniform(min_delay, max_delay))
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGKILL)
                killed += 1
            worker.wait()
        rows = count_rows(env) if round_no % 5 == 0 else None
        log(f"round {round_no}: {killed}/{kills} kills" + (f", events so far {rows[0]}" if rows else ""))
    final = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--until-idle", "3"],
        env={**env, "TRAJLAKE_CONSUMER_GROUP": "chaos-final"},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if final.returncode != 0:
        raise RuntimeError(f"final ingest failed: {final.stdout}\n{final.stderr[-3000:]}")
    rows, distinct, dead = count_rows(env)
    return ChaosResult(
        events=events,
        poison=poison,
        kills=killed,
        rows=rows,
        distinct_event_ids=distinct,
        dead_letters=dead,
        lost=events - distinct,
        duplicated=rows - distinct,
        seconds=round(time.monotonic() - started, 1),
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: run one chaos trial against real Kafka and print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rows", type=int, default=2000, help="TRAJLAKE_INGEST_MAX_ROWS of the workers")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trajlake-chaos-") as tmp:
        server = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            from kafka_server import KafkaServer, ensure_classpath

            ensure_classpath()
            server = KafkaServer(Path(tmp) / "kafka").start()
            bootstrap = server.bootstrap
        try:
            result = run_chaos(
                bootstrap, Path(tmp) / "home", args.events, args.kills, seed=args.seed, max_rows=args.max_rows
            )
        finally:
            if server is not None:
                server.stop()
    if args.json:
        print(json.dumps({**asdict(result), "exactly_once": result.exactly_once}))
    else:
        print(
            f"events {result.events}, poison {result.poison}, kills {result.kills}: rows {result.rows}, "
            f"distinct {result.distinct_event_ids}, dead letters {result.dead_letters}, lost {result.lost}, "
            f"duplicated {result.duplicated} in {result.seconds} s -> "
            f"{'EXACTLY ONCE' if result.exactly_once else 'VIOLATED'}"
        )
    return 0 if result.exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
