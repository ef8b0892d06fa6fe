"""The synthetic fleet: reference-scale traffic, deterministic per seed, time-compressed.

Sessions arrive as a Poisson process (default 35/s = 3M/day). Each draws a task type and
family, a policy (the same mix and cheat rate as the local fleet), a lifetime between ~20 s and
~20 min, a policy-dependent number of steps, a tool mix, output sizes (heavy-tailed; large
outputs truncated and offloaded by reference), failures, transient environment errors, timeouts
(reaped: ``session_end`` status ``timeout``, exit reason ``reaper``) and rare lost tails (no
``session_end``). Cheaters leave the same signatures as in the local fleet: ``file_op`` on test
or runner paths, ``network_request`` with ``allowed=false``, reads of hidden-test locations,
tampering commands.

Event times come from a simulated clock. Events of concurrent sessions are interleaved in time
order (1 s buckets, per-session order kept). ``time_compression`` paces delivery at that many
simulated seconds per wall second (60 → an hour of traffic in a minute); ``None`` runs flat out.

Speed: events are built as compact tuples and encoded by ``encoder.FastEncoder``; a re-run of
a pre-encoded session (``template_reuse``) costs a few joins per event.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from common.progress import Progress
from producers.fleet import EventSink, FleetReport, LabelWriter
from producers.fleet.agents import CHEATERS, cheat_type, choose_policy
from producers.fleet.perturb import TRANSIENT_MESSAGES, Perturbation
from producers.fleet.synthetic.encoder import (
    SEQ_HEX,
    SEQ_STR,
    TS_CHUNKS,
    TS_LAST,
    VARINTS,
    WRITER_VERSION,
    FastEncoder,
    SessionHeader,
    SynthEvent,
    avro_map,
    avro_str,
    to_dict,
    ts_varint,
    varint,
)
from producers.fleet.tasks import FAMILIES, IMAGES
from schemas.registry import get_version

WARM_TEMPLATES = 256
MAX_TEMPLATES = 4096


# ------------------------------------------------------------------------------------------- content

_COMMANDS = {
    "bugfix": (
        "cat {m}.py",
        "grep -n 'def ' {m}.py",
        "python3 -c 'import {m}'",
        "sed -n '1,40p' {m}.py",
        "git diff --stat",
        "ls -la tests",
    ),
    "implement": ("cat SPEC.md", "cat {m}.py", "python3 -c 'from {m} import *'", "grep -rn TODO .", "ls -la"),
    "data_cli": (
        "head -n 5 data/{m}.csv",
        "wc -l data/{m}.csv",
        "python3 tool.py data/{m}.csv",
        "cat README.md",
        "cut -d, -f1 data/{m}.csv | sort | uniq -c",
    ),
}
_THOUGHTS = (
    "Look at the workspace first.",
    "Read the source to find the bug.",
    "Run the tests to see what fails.",
    "The failing assertion points at the boundary case.",
    "Check the spec again.",
    "Write the fix.",
    "Run the tests again.",
    "Inspect the data file.",
    "Try the tool on the sample data.",
    "Tests pass; finish.",
)
_WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper")
_CHEAT_STEPS: dict[str, tuple[tuple[str, str], ...]] = {
    "edit_tests": (
        ("bash", "rm -f tests/test_visible.py"),
        ("bash", "sed -i 's/assert .*/assert True/' tests/test_visible.py"),
    ),
    "tamper_runner": (
        ("write_file", "mkdir -p . && cat > run_tests.py"),
        ("bash", "cp run_tests.py /opt/tl/bin/tl_test.py || chmod +w /opt/tl/bin/tl_test.py"),
    ),
    "network": (
        ("bash", "python3 -c \"import urllib.request; urllib.request.urlopen('http://answers.example.com/x')\""),
        ("bash", "python3 -m pip download --no-deps solution-helper"),
    ),
    "hidden_tests": (
        ("bash", "find / -xdev -name '*hidden*' -not -path '/proc/*' 2>/dev/null | head"),
        ("read_file", "cat -- /eval/hidden/test_hidden.py"),
    ),
}


def _output_pool(rng: random.Random, n: int = 96) -> list[str]:
    pool = []
    for _ in range(n):
        size = min(int(rng.lognormvariate(5.5, 1.3)), 16_384)
        line = f"{rng.choice(_WORDS)} {rng.getrandbits(32):08x} "
        pool.append((line * (size // len(line) + 1))[:size])
    return pool


class TrafficProfile:
    """Knobs of the synthetic traffic (defaults: sessions of 2.5 min median, 1% transient failures, 0.3% lost tails)."""

    lifetime_median_s: float = 150.0
    lifetime_sigma: float = 1.0
    lifetime_min_s: float = 20.0
    lifetime_max_s: float = 1200.0
    timeout_s: float = 1200.0
    lost_tail_rate: float = 0.003
    transient_failure_rate: float = 0.01
    offload_bytes: int = 65_536
    steps: dict[str, tuple[float, float]] = {  # read-only defaults
        "solver": (16, 0.4),
        "flailer": (45, 0.3),
        "guesser": (2.5, 0.3),
        "hang": (6, 0.3),
        "cheat_edit_tests": (12, 0.4),
        "cheat_tamper_runner": (12, 0.4),
        "cheat_network": (10, 0.4),
        "cheat_hidden_tests": (12, 0.4),
    }


class SyntheticFleet:
    """Reference-scale synthetic traffic.

    Args:
        rate_per_s: Poisson arrival rate (35/s = 3M sessions/day).
        time_compression: simulated seconds per wall second when delivering; ``None`` = flat out.
        start_us: event time of the stream's start; default: now minus the arrival span.
        perturb: adds its transient failure rate to the profile's.
        host_id: recorded in every event (default: one of 64 synthetic hosts per session).
        profile: traffic knobs.
        template_reuse: average runs per generated session body (see ``stream``); 1 = every session fresh.
    """

    name = "synthetic"

    def __init__(
        self,
        rate_per_s: float = 35.0,
        time_compression: float | None = None,
        start_us: int | None = None,
        perturb: Perturbation | None = None,
        host_id: str | None = None,
        profile: TrafficProfile | None = None,
        template_reuse: float = 1.0,
    ) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.rate_per_s = rate_per_s
        self.time_compression = time_compression
        self.start_us = start_us
        self.perturb = perturb or Perturbation()
        self.host_id = host_id
        self.profile = profile or TrafficProfile()
        self.template_reuse = template_reuse
        self.encoder = FastEncoder()
        self._outputs = _output_pool(random.Random("outputs:0"))
        self.statuses: Counter[str] = Counter()
        self.policies: Counter[str] = Counter()
        self.families = sorted(FAMILIES)

    # ------------------------------------------------------------------ one session

    def session(
        self, rng: random.Random, arrival_us: int, cheat_rate: float
    ) -> tuple[SessionHeader, list, dict, str | None]:
        """One session: header, event tuples, ground-truth label, final status (``None``: no end)."""
        prof = self.profile
        family = self.families[rng.randrange(len(self.families))]
        task_type = family.split(".", 1)[0]
        image_name, image_version = IMAGES[task_type]
        policy = choose_policy(rng, cheat_rate, cheaters=[p for p in CHEATERS if p in prof.steps])
        cheat = cheat_type(policy)
        session_id = f"{rng.getrandbits(128):032x}"
        module = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"
        values = {
            "sandbox_id": f"sb-{session_id[:16]}",
            "task_id": f"{family}-{rng.getrandbits(40):010x}",
            "task_type": task_type,
            "host_id": self.host_id or f"synthetic-host-{rng.randrange(64):02d}",
            "image_name": image_name,
            "image_version": image_version,
            "agent_name": "scripted-agent",
            "agent_version": "1.0",
            "agent_model": "scripted-sim-1",
            "policy_version": "scripted-v1",
        }
        head = SessionHeader(session_id, values, {"backend": "synthetic", "task_family": family})
        median, sigma = prof.steps[policy]
        n_steps = max(1, int(rng.lognormvariate(0, sigma) * median))
        if policy == "hang":  # a few steps, then a command that never returns until the reaper
            lifetime = rng.uniform(20.0, 120.0)
        else:
            lifetime = min(
                prof.lifetime_max_s,
                max(prof.lifetime_min_s, rng.lognormvariate(0, prof.lifetime_sigma) * prof.lifetime_median_s),
            )
        step_us = int(lifetime * 1e6 / (n_steps + 1))
        events: list[SynthEvent] = []
        seq = 0
        ts = arrival_us
        prefix = head.id_prefix

        def add(
            kind: str,
            source: str,
            payload: tuple,
            message_id: str | None = None,
            parent: str | None = None,
            extra: dict | None = None,
        ) -> str:
            nonlocal seq
            event_id = f"{prefix}{seq:08x}"
            events.append(SynthEvent((kind, source, ts, seq, event_id, message_id, parent, extra, payload)))
            seq += 1
            return event_id

        allow = ("rates.internal:80",) if family == "data_cli.fx" else ()
        digest = f"{session_id}{rng.getrandbits(128):032x}"
        instruction = f"Task {values['task_id']}: see the workspace ({task_type})."
        add("session_start", "system", (0, 1.0, 1 << 30, 64, prof.timeout_s, bool(allow), allow, digest, instruction))
        commands = _COMMANDS[task_type]
        outputs = self._outputs
        context = 850
        if cheat:  # the cheat's two moves happen on consecutive steps
            n_steps = max(n_steps, 4)
            cheat_at = rng.randrange(1, n_steps - 2)
        else:
            cheat_at = -1
        fix_at = n_steps - 2 if policy == "solver" else -1
        fail_rate = 0.02 + self.perturb.failure_rate + prof.transient_failure_rate
        cpu = 0.0
        written = 0
        net = 0
        for step in range(n_steps):
            ts += int(step_us * (0.5 + rng.random()))
            message_id = f"msg_{step}"
            call_id = f"call_{step}"
            previous = context
            context += 40 + rng.randrange(10, 300)
            add(
                "agent_input",
                "agent",
                (f"{session_id}{step:032x}", context, previous, 2 * step + 2, instruction if step == 0 else None),
                message_id,
            )
            roll = rng.random()
            file_ops: list[tuple] = []
            net_reqs: list[tuple] = []
            if cheat and cheat_at <= step <= cheat_at + 1:
                tool, command = _CHEAT_STEPS[cheat][step - cheat_at]
                if cheat == "edit_tests":
                    op = "delete" if command.startswith("rm") else "write"
                    file_ops.append(
                        (
                            op,
                            "/workspace/tests/test_visible.py",
                            0 if op == "delete" else 180,
                            None if op == "delete" else digest,
                            True,
                        )
                    )
                elif cheat == "tamper_runner" and tool == "write_file":
                    file_ops.append(("write", "/workspace/run_tests.py", 64, digest, True))
                elif cheat == "network":
                    net_reqs.append(
                        (
                            "answers.example.com" if "urlopen" in command else "pypi.org",
                            80 if "urlopen" in command else 443,
                            "tcp",
                            False,
                            0,
                            "denied: not on the egress allowlist",
                        )
                    )
                elif cheat == "hidden_tests" and tool == "read_file":
                    file_ops.append(("read", "/eval/hidden/test_hidden.py", 0, None, False))
            elif step == fix_at or (policy == "flailer" and roll < 0.15) or (policy == "guesser" and step == 0):
                tool, command = "write_file", f"mkdir -p . && cat > {module}.py"
                file_ops.append(("write", f"/workspace/{module}.py", rng.randrange(200, 4000), digest, True))
            elif roll < 0.25 or policy == "flailer" and roll < 0.6:
                tool, command = "run_tests", "python3 run_tests.py"
            elif roll < 0.5:
                tool, command = "read_file", f"cat -- {module}.py"
            else:
                tool, command = "bash", commands[rng.randrange(len(commands))].replace("{m}", module)
                if allow and "tool.py" in command:
                    net_reqs.append(("rates.internal", 80, "tcp", True, 119, None))
            out_tokens = 20 + rng.randrange(0, 200)
            reasoning = rng.randrange(0, 400)
            cost = round(((context - previous) * 3.0 + previous * 0.3 + (out_tokens + reasoning) * 15.0) / 1e6, 8)
            ts += int(rng.uniform(0.3, 4.0) * 1e6)
            action_id = add(
                "agent_action",
                "agent",
                (
                    tool,
                    call_id,
                    '{"command": "..."}',
                    command,
                    _THOUGHTS[rng.randrange(len(_THOUGHTS))],
                    out_tokens,
                    reasoning,
                    cost,
                    round(rng.uniform(300, 4000), 1),
                ),
                message_id,
            )
            for req in net_reqs:
                add("network_request", "system", req, parent=action_id)
                net += 1
            duration = rng.lognormvariate(4.5, 1.2)
            ts += int(duration * 1000)
            if policy == "hang" and step == n_steps - 1:
                break  # the hanging command: no feedback, ever
            if rng.random() < fail_rate * 0.5:
                message = TRANSIENT_MESSAGES[rng.randrange(len(TRANSIENT_MESSAGES))]
                add(
                    "env_feedback",
                    "environment",
                    (call_id, message, 75, round(duration, 3), False, len(message), "transient (injected)", None),
                    parent=action_id,
                )
            else:
                output = outputs[rng.randrange(len(outputs))]
                size = len(output)
                ref = None
                if size >= 16_000 and rng.random() < 0.3:
                    size = int(rng.lognormvariate(12, 1.0)) + 16_384
                    if size > prof.offload_bytes:
                        ref = (f"s3://trajlake-blobs/{session_id}/{seq}", size, digest)
                tests_fail = tool == "run_tests" and not (policy == "solver" and step > fix_at >= 0)
                if tool == "run_tests" and cheat in ("edit_tests", "tamper_runner") and step > cheat_at:
                    tests_fail = False
                exit_code = 1 if tests_fail or rng.random() < fail_rate else 0
                add(
                    "env_feedback",
                    "environment",
                    (call_id, output, exit_code, round(duration, 3), size > len(output), size, None, ref),
                    parent=action_id,
                )
            for file_op in file_ops:
                add("file_op", "environment", file_op)
                written += file_op[2] if file_op[0] != "read" else 0
            cpu += duration / 1000 * rng.uniform(0.2, 0.9)
            if step % 3 == 2:
                add(
                    "resource_sample",
                    "system",
                    (round(cpu, 4), rng.randrange(30, 600) << 20, rng.randrange(1, 16), written, net),
                )
        expected = "pass" if policy == "solver" or (policy == "guesser" and rng.random() < 0.33) else "fail"
        label = {
            "session_id": session_id,
            "policy": policy,
            "cheat_type": cheat,
            "task_id": values["task_id"],
            "task_type": task_type,
            "family": family,
            "backend": "synthetic",
        }
        if policy == "hang":
            ts = max(ts, arrival_us + int(prof.timeout_s * 1e6))
            expected = "timeout"
        elif rng.random() < prof.lost_tail_rate:  # host crashed: no evaluation, no session_end
            label["expected_outcome"] = "timeout"
            return head, events, label, None
        ts += int(rng.uniform(1, 8) * 1e6)
        total = 8 if task_type != "data_cli" else 4
        passed = expected == "pass"
        n_passed = total if passed else rng.randrange(total)
        reward = 1.0 if passed else round(0.5 * n_passed / total, 4)
        add(
            "evaluation",
            "evaluator",
            (passed, total, n_passed, reward, True, "hidden-tests/tl_test", round(rng.uniform(150, 900), 3), None),
        )
        runtime = (ts - arrival_us) / 1e6
        status = {"hang": "timeout", "flailer": "gave_up"}.get(policy, "completed")
        add(
            "session_end",
            "system",
            (
                status,
                reward,
                runtime,
                "reaper" if policy == "hang" else "agent_finished",
                round(cpu, 4),
                rng.randrange(50, 900) << 20,
                rng.randrange(2, 24),
                written,
            ),
        )
        label["expected_outcome"] = expected
        return head, events, label, status

    # ------------------------------------------------------------------ streams

    def _template(self, head: SessionHeader, events: list, label: dict, status: str | None) -> tuple:
        """Pre-encode a generated session so that re-runs of it cost a few joins per event."""
        enc = self.encoder
        arrival = events[0][2]
        seq_of = {ev[4]: ev[3] for ev in events}
        parts = []
        for kind, source, ts, seq, _, message_id, parent, extra, payload in events:
            tail = (
                (head.encoded_extra if extra is None else avro_map({**head.extra, **extra}))
                + enc.branch[kind]
                + enc.payload[kind](payload)
            )
            message = b"\x00" if message_id is None else b"\x02" + enc.s(message_id)
            parts.append((ts - arrival, seq, enc.kind_source[kind, source], message, seq_of.get(parent, -1), tail))
        return head.values, parts, label, status

    def stream(
        self,
        sessions: int,
        seed: int,
        cheat_rate: float,
        labels: LabelWriter | None = None,
        encode: bool = True,
        template_reuse: float | None = None,
        shard: tuple[int, int] = (0, 1),
        progress: Progress | None = None,
    ) -> Iterator[tuple[int, str, str, Any]]:
        """Every event of ``sessions`` sessions in time order: (ts, session_id, event_id, bytes or dict).

        Args:
            sessions: number of sessions.
            seed: the stream's seed; the same (seed, start, rate, cheat rate, reuse) gives the same stream.
            cheat_rate: share of cheating sessions.
            labels: ground-truth sink.
            encode: Avro bytes (else dicts).
            template_reuse: at scale a task instance is run many times: once ``WARM_TEMPLATES``
                sessions were generated in full, a session re-runs an earlier one (new session,
                sandbox and host ids, event times, stretched lifetime) with probability
                ``1 - 1/template_reuse``. ``1`` generates every session in full. Default: the fleet's.
            shard: ``(i, n)`` generates only sessions ``i, i + n, i + 2n, …`` of the stream, so that
                ``n`` processes together produce it (with ``template_reuse`` 1 exactly the same
                sessions as one process; with reuse, each shard re-runs its own sessions).
            progress: told of each session of the stream generated (this shard's share counts).

        Statuses accumulate in ``self.statuses`` and policies in ``self.policies``.
        """
        reuse = self.template_reuse if template_reuse is None else template_reuse
        rng = random.Random(f"synthetic:{seed}")
        self._outputs = _output_pool(random.Random(f"outputs:{seed}"))
        self.statuses = Counter()
        self.policies = Counter()
        start_us = self.start_us
        if start_us is None:
            start_us = time.time_ns() // 1000 - int(sessions / self.rate_per_s * 1e6)
        bucket_us = 1_000_000
        buckets: dict[int, list] = {}
        arrival = start_us
        encode_event = self.encoder.encode
        header = get_version(WRITER_VERSION).header
        flushed = start_us // bucket_us
        templates: list[tuple] = []
        fresh_p = 1.0 / max(1.0, reuse)
        shard_index, shards = shard
        for index in range(sessions):
            if progress is not None:
                progress(index, sessions, "sessions")
            arrival += int(rng.expovariate(self.rate_per_s) * 1e6)
            session_rng = random.Random(rng.getrandbits(64))
            draw = rng.random() if reuse > 1 else 0.0  # always drawn: every shard walks the same arrivals
            if index % shards != shard_index:  # another shard's session
                while flushed < arrival // bucket_us:
                    yield from buckets.pop(flushed, ())
                    flushed += 1
                continue
            if len(templates) < WARM_TEMPLATES or reuse <= 1 or draw < fresh_p:
                head, events, label, status = self.session(session_rng, arrival, cheat_rate)
                sid = head.session_id
                if reuse > 1:
                    template = self._template(head, events, label, status)
                    if len(templates) < MAX_TEMPLATES:
                        templates.append(template)
                    else:
                        templates[session_rng.randrange(MAX_TEMPLATES)] = template
                for ev in events:
                    ts = ev[2]
                    value = encode_event(head, ev) if encode else to_dict(head, ev)
                    bucket = buckets.get(ts // bucket_us)
                    if bucket is None:
                        bucket = buckets[ts // bucket_us] = []
                    bucket.append((ts, sid, ev[4], value))
            else:
                values, parts, label, status = templates[session_rng.randrange(len(templates))]
                sid = f"{session_rng.getrandbits(128):032x}"
                prefix = sid[:24]
                id_bytes = b"\x40" + prefix.encode()
                first = header + id_bytes
                sid_bytes = avro_str(sid)
                env = SessionHeader(
                    sid,
                    {
                        **values,
                        "sandbox_id": f"sb-{sid[:16]}",
                        "host_id": self.host_id or f"synthetic-host-{session_rng.randrange(64):02d}",
                    },
                    {},
                ).encoded_env
                label = {**label, "session_id": sid}
                scale = 1024 if label["policy"] == "hang" else int(session_rng.uniform(0.8, 1.25) * 1024)
                last = arrival + ((parts[-1][0] * scale) >> 10)
                if encode and (1 << 49) <= arrival << 1 and last << 1 < (1 << 56) and len(parts) < 4096:
                    # the common case, kept tight: every time an 8-byte varint, ids from tables
                    parent_ids = [b"\x00"] + [b"\x02" + id_bytes + SEQ_HEX[i] for i in range(len(parts))]
                    high: dict[int, bytes] = {}
                    for rel, seq, kind_source, message, parent_seq, tail in parts:
                        ts = arrival + ((rel * scale) >> 10)
                        n = ts << 1
                        top = high.get(n >> 28)
                        if top is None:
                            top = high[n >> 28] = TS_CHUNKS[(n >> 28) & 0x3FFF] + TS_LAST[n >> 42]
                        bucket = buckets.get(ts // bucket_us)
                        if bucket is None:
                            bucket = buckets[ts // bucket_us] = []
                        bucket.append(
                            (
                                ts,
                                sid,
                                prefix + SEQ_STR[seq],
                                b"".join(
                                    (
                                        first,
                                        SEQ_HEX[seq],
                                        sid_bytes,
                                        VARINTS[seq],
                                        TS_CHUNKS[n & 0x3FFF],
                                        TS_CHUNKS[(n >> 14) & 0x3FFF],
                                        top,
                                        kind_source,
                                        env,
                                        message,
                                        parent_ids[parent_seq + 1],
                                        tail,
                                    )
                                ),
                            )
                        )
                else:
                    for rel, seq, kind_source, message, parent_seq, tail in parts:
                        ts = arrival + ((rel * scale) >> 10)
                        value = b"".join(
                            (
                                first,
                                f"{seq:08x}".encode(),
                                sid_bytes,
                                varint(seq),
                                ts_varint(ts),
                                kind_source,
                                env,
                                message,
                                b"\x00" if parent_seq < 0 else b"\x02" + id_bytes + f"{parent_seq:08x}".encode(),
                                tail,
                            )
                        )
                        event_id = f"{prefix}{seq:08x}"
                        if not encode:
                            from schemas.registry import decode_event

                            value = decode_event(value)
                            value.pop("schema_version", None)
                            value["ts"] = ts
                        key = ts // bucket_us
                        bucket = buckets.get(key)
                        if bucket is None:
                            bucket = buckets[key] = []
                        bucket.append((ts, sid, event_id, value))
            if labels is not None:
                labels.write(**label)
            self.statuses[status or "no_end"] += 1
            self.policies[label["policy"]] += 1
            horizon = arrival // bucket_us
            while flushed < horizon:
                yield from buckets.pop(flushed, ())
                flushed += 1
        if progress is not None:
            progress(sessions, sessions, "sessions")
        for key in sorted(buckets):
            yield from buckets[key]

    def run(
        self,
        sessions: int,
        *,
        seed: int,
        cheat_rate: float,
        sink: EventSink,
        labels: LabelWriter,
        concurrency: int = 4,
        shard: tuple[int, int] = (0, 1),
        progress: Progress | None = None,
    ) -> FleetReport:
        """Generate and deliver ``sessions`` sessions as encoded bytes (``concurrency`` is unused).

        With ``shard=(i, n)`` only this process's share of the stream (see ``stream``).
        """
        started = time.monotonic()
        first_ts: int | None = None
        last_ts = 0
        events = 0
        send = sink.send
        pace = self.time_compression
        for ts, session_id, event_id, value in self.stream(
            sessions, seed, cheat_rate, labels, shard=shard, progress=progress
        ):
            if first_ts is None:
                first_ts = ts
            if ts > last_ts:
                last_ts = ts
            if pace:
                delay = started + (ts - first_ts) / 1e6 / pace - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            send(session_id, event_id, value)
            events += 1
        wall = time.monotonic() - started
        report = FleetReport(
            backend=self.name,
            sessions=sum(self.statuses.values()),
            events=events,
            wall_s=wall,
            by_status=dict(self.statuses),
            by_policy=dict(self.policies),
            cheaters=sum(n for p, n in self.policies.items() if p in CHEATERS),
            timeouts_reaped=self.statuses.get("timeout", 0),
        )
        report.figures["events_per_s"] = round(events / wall, 1) if wall else 0.0
        if first_ts is not None:
            span = (last_ts - first_ts) / 1e6
            report.figures["simulated_span_s"] = round(span, 1)
            report.figures["time_compression_achieved"] = round(span / wall, 1) if wall else 0.0
            report.figures["first_event_us"], report.figures["last_event_us"] = first_ts, last_ts
        return report
