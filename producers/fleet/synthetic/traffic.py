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
from producers.fleet.agents import CHEATERS
from producers.fleet.lifecycle import run_staged
from producers.fleet.perturb import Perturbation
from producers.fleet.report import FleetReport, LabelWriter
from producers.fleet.sinks import EventSink
from producers.fleet.synthetic.encoder import (
    SEQ_HEX,
    SEQ_STR,
    TS_CHUNKS,
    TS_LAST,
    VARINTS,
    WRITER_VERSION,
    FastEncoder,
    SessionHeader,
    avro_map,
    avro_str,
    to_dict,
    ts_varint,
    varint,
)
from producers.fleet.synthetic.session import Record, SyntheticStages, TrafficProfile, output_pool
from producers.fleet.tasks import FAMILIES
from schemas.registry import get_version

WARM_TEMPLATES = 256
MAX_TEMPLATES = 4096
BUCKET_US = 1_000_000  # events are interleaved in time order within 1 s buckets


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
        self._outputs = output_pool(random.Random("outputs:0"))
        self.statuses: Counter[str] = Counter()
        self.policies: Counter[str] = Counter()
        self.families = sorted(FAMILIES)

    # ------------------------------------------------------------------ one session

    def session(self, rng: random.Random, arrival_us: int, cheat_rate: float) -> Record:
        """One session in stages (``synthetic.session``): header, event tuples, ground-truth label,
        final status (``None``: no end)."""
        stages = SyntheticStages(
            self.profile, self.families, self._outputs, self.perturb, self.host_id, rng, arrival_us, cheat_rate
        )
        return run_staged(stages)

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

        Steps per session: draw its arrival; unless another shard's, either generate it in full
        (``_place_fresh``) or re-run a template (``_place_rerun``), placing its events in 1 s
        buckets; record its label; then hand on every bucket the arrivals have passed.
        """
        reuse = self.template_reuse if template_reuse is None else template_reuse
        rng = random.Random(f"synthetic:{seed}")
        self._outputs = output_pool(random.Random(f"outputs:{seed}"))
        self.statuses = Counter()
        self.policies = Counter()
        start_us = self.start_us
        if start_us is None:
            start_us = time.time_ns() // 1000 - int(sessions / self.rate_per_s * 1e6)
        buckets: dict[int, list] = {}
        arrival = start_us
        header = get_version(WRITER_VERSION).header
        flushed = start_us // BUCKET_US
        templates: list[tuple] = []
        fresh_p = 1.0 / max(1.0, reuse)
        shard_index, shards = shard
        for index in range(sessions):
            if progress is not None:
                progress(index, sessions, "sessions")
            arrival += int(rng.expovariate(self.rate_per_s) * 1e6)
            session_rng = random.Random(rng.getrandbits(64))
            draw = rng.random() if reuse > 1 else 0.0  # always drawn: every shard walks the same arrivals
            if index % shards == shard_index:  # else another shard's session
                if len(templates) < WARM_TEMPLATES or reuse <= 1 or draw < fresh_p:
                    label, status = self._place_fresh(
                        session_rng, arrival, cheat_rate, encode, reuse > 1, templates, buckets
                    )
                else:
                    template = templates[session_rng.randrange(len(templates))]
                    label, status = self._place_rerun(template, session_rng, arrival, encode, header, buckets)
                if labels is not None:
                    labels.write(**label)
                self.statuses[status or "no_end"] += 1
                self.policies[label["policy"]] += 1
            while flushed < arrival // BUCKET_US:
                yield from buckets.pop(flushed, ())
                flushed += 1
        if progress is not None:
            progress(sessions, sessions, "sessions")
        for key in sorted(buckets):
            yield from buckets[key]

    def _place_fresh(
        self,
        session_rng: random.Random,
        arrival: int,
        cheat_rate: float,
        encode: bool,
        keep_template: bool,
        templates: list[tuple],
        buckets: dict[int, list],
    ) -> tuple[dict, str | None]:
        """Generate one session in full and place its events; keep it as a template when re-runs are on
        (up to ``MAX_TEMPLATES``, then replacing a random one). Returns its label and final status."""
        head, events, label, status = self.session(session_rng, arrival, cheat_rate)
        sid = head.session_id
        if keep_template:
            template = self._template(head, events, label, status)
            if len(templates) < MAX_TEMPLATES:
                templates.append(template)
            else:
                templates[session_rng.randrange(MAX_TEMPLATES)] = template
        encode_event = self.encoder.encode
        for ev in events:
            ts = ev[2]
            value = encode_event(head, ev) if encode else to_dict(head, ev)
            bucket = buckets.get(ts // BUCKET_US)
            if bucket is None:
                bucket = buckets[ts // BUCKET_US] = []
            bucket.append((ts, sid, ev[4], value))
        return label, status

    def _place_rerun(
        self,
        template: tuple,
        session_rng: random.Random,
        arrival: int,
        encode: bool,
        header: bytes,
        buckets: dict[int, list],
    ) -> tuple[dict, str | None]:
        """Re-run a template as a new session (new ids, host, arrival and stretched lifetime) and place
        its events. Returns its label and final status."""
        values, parts, label, status = template
        sid = f"{session_rng.getrandbits(128):032x}"
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
        rerun = _Rerun(sid, header, env, arrival, scale)
        last = arrival + ((parts[-1][0] * scale) >> 10)
        if encode and (1 << 49) <= arrival << 1 and last << 1 < (1 << 56) and len(parts) < 4096:
            _place_rerun_tight(rerun, parts, buckets)
        else:
            _place_rerun_general(rerun, parts, encode, buckets)
        return label, status

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


class _Rerun:
    """What every event of one re-run session shares: its new id (and the encoded pieces made
    of it), encoded envelope, arrival time and lifetime stretch (``scale`` / 1024)."""

    __slots__ = ("arrival", "env", "first", "id_bytes", "prefix", "scale", "sid", "sid_bytes")

    def __init__(self, sid: str, header: bytes, env: bytes, arrival: int, scale: int) -> None:
        self.sid = sid
        self.prefix = sid[:24]
        self.id_bytes = b"\x40" + self.prefix.encode()
        self.first = header + self.id_bytes
        self.sid_bytes = avro_str(sid)
        self.env = env
        self.arrival = arrival
        self.scale = scale


def _place_rerun_tight(rerun: _Rerun, parts: list, buckets: dict[int, list]) -> None:
    """The common case of a re-run, kept tight: encoded, every time an 8-byte varint, ids from tables."""
    sid, prefix, first, sid_bytes, env = rerun.sid, rerun.prefix, rerun.first, rerun.sid_bytes, rerun.env
    arrival, scale = rerun.arrival, rerun.scale
    parent_ids = [b"\x00"] + [b"\x02" + rerun.id_bytes + SEQ_HEX[i] for i in range(len(parts))]
    high: dict[int, bytes] = {}
    for rel, seq, kind_source, message, parent_seq, tail in parts:
        ts = arrival + ((rel * scale) >> 10)
        n = ts << 1
        top = high.get(n >> 28)
        if top is None:
            top = high[n >> 28] = TS_CHUNKS[(n >> 28) & 0x3FFF] + TS_LAST[n >> 42]
        bucket = buckets.get(ts // BUCKET_US)
        if bucket is None:
            bucket = buckets[ts // BUCKET_US] = []
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


def _place_rerun_general(rerun: _Rerun, parts: list, encode: bool, buckets: dict[int, list]) -> None:
    """Any re-run: times of any size, long sessions, and dicts rather than bytes (``encode`` false)."""
    sid, prefix, first, sid_bytes, env, id_bytes = (
        rerun.sid,
        rerun.prefix,
        rerun.first,
        rerun.sid_bytes,
        rerun.env,
        rerun.id_bytes,
    )
    arrival, scale = rerun.arrival, rerun.scale
    for rel, seq, kind_source, message, parent_seq, tail in parts:
        ts = arrival + ((rel * scale) >> 10)
        value: Any = b"".join(
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
        key = ts // BUCKET_US
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = []
        bucket.append((ts, sid, event_id, value))
