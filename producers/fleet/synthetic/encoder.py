"""Avro single-object encoding of synthetic events, hand-written for speed.

Every event is first built as a compact tuple (``SynthEvent``: kind, source, ts, ids, payload
fields in schema order). ``FastEncoder`` writes Avro single-object bytes straight from the tuple
using per-session pre-encoded envelope bytes (``SessionHeader``) and pre-encoded string pools;
``to_dict`` gives the same event as a dict for the SDK path. Both are checked byte-for-byte
against ``schemas.registry.encode_event`` in the tests. The lookup tables (``VARINTS``,
``TS_CHUNKS``, ``TS_LAST``, ``SEQ_HEX``) are shared with the template re-run path of the traffic model.
"""

from __future__ import annotations

import struct
from typing import Any

from schemas.registry import get_version

#: The writer schema the fast path encodes (readers resolve it to the latest version). Pinned:
#: a schema version never changes, so a newer one never silently breaks the hand-written encoder.
WRITER_VERSION = 1
ENVELOPE = (
    "event_id",
    "session_id",
    "seq",
    "ts",
    "event_type",
    "source",
    "sandbox_id",
    "task_id",
    "task_type",
    "host_id",
    "image_name",
    "image_version",
    "agent_name",
    "agent_version",
    "agent_model",
    "policy_version",
    "agent_message_id",
    "parent_event_id",
    "extra",
    "payload",
)
SOURCES = ("agent", "environment", "system", "evaluator")
#: payload field names per kind, in schema order (tuples in ``SynthEvent.payload`` follow them)
FIELDS: dict[str, tuple[str, ...]] = {}
_DOUBLE = struct.Struct("<d").pack
VARINT_CACHE_SIZE = 1 << 16


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


VARINTS = [zigzag(i) for i in range(VARINT_CACHE_SIZE)]
# 14-bit chunks of a varint with the continuation bit set on both bytes, and for the last chunk
TS_CHUNKS = [bytes(((x & 0x7F) | 0x80, ((x >> 7) & 0x7F) | 0x80)) for x in range(1 << 14)]
TS_LAST = [bytes(((x & 0x7F) | 0x80, x >> 7)) for x in range(1 << 14)]
SEQ_HEX = [f"{i:08x}".encode() for i in range(1 << 12)]
SEQ_STR = [f"{i:08x}" for i in range(1 << 12)]


def ts_varint(ts: int) -> bytes:
    """Zig-zag varint of a positive ``long`` by table lookup when it takes exactly 8 bytes (epoch micros)."""
    n = ts << 1
    if (1 << 49) <= n < (1 << 56):
        return TS_CHUNKS[n & 0x3FFF] + TS_CHUNKS[(n >> 14) & 0x3FFF] + TS_CHUNKS[(n >> 28) & 0x3FFF] + TS_LAST[n >> 42]
    return zigzag(ts)


def varint(n: int) -> bytes:
    """Avro ``int``/``long`` (zig-zag varint)."""
    return VARINTS[n] if 0 <= n < VARINT_CACHE_SIZE else zigzag(n)


def avro_str(text: str) -> bytes:
    """Avro ``string``."""
    data = text.encode()
    return varint(len(data)) + data


def avro_opt_str(text: str | None) -> bytes:
    """Avro ``["null", "string"]``."""
    return b"\x00" if text is None else b"\x02" + avro_str(text)


def avro_map(values: dict[str, str]) -> bytes:
    """Avro ``map<string>`` as one block (like fastavro)."""
    if not values:
        return b"\x00"
    return varint(len(values)) + b"".join(avro_str(k) + avro_str(v) for k, v in values.items()) + b"\x00"


class SynthEvent(tuple):
    """(kind, source, ts, seq, event_id, message_id, parent_event_id, extra, payload tuple)."""

    __slots__ = ()


class SessionHeader:
    """Per-session envelope values and their pre-encoded bytes."""

    __slots__ = (
        "session_id",
        "values",
        "encoded_sid",
        "encoded_env",
        "encoded_extra",
        "extra",
        "id_prefix",
        "id_bytes",
    )

    def __init__(self, session_id: str, values: dict[str, Any], extra: dict[str, str]) -> None:
        self.session_id = session_id
        self.values = values
        self.extra = extra
        self.id_prefix = session_id[:24]
        self.id_bytes = b"\x40" + self.id_prefix.encode()
        self.encoded_sid = avro_str(session_id)
        self.encoded_env = b"".join(
            avro_str(values[k])
            for k in ("sandbox_id", "task_id", "task_type", "host_id", "image_name", "image_version")
        ) + b"".join(avro_opt_str(values[k]) for k in ("agent_name", "agent_version", "agent_model", "policy_version"))
        self.encoded_extra = avro_map(extra)


def payload_fields() -> dict[str, tuple[str, ...]]:
    if not FIELDS:
        payload = next(f for f in get_version(WRITER_VERSION).raw["fields"] if f["name"] == "payload")
        kinds = list(get_version(WRITER_VERSION).payload_kinds)
        for kind, branch in zip(kinds, payload["type"], strict=True):
            FIELDS[kind] = tuple(f["name"] for f in branch["fields"])
    return FIELDS


class FastEncoder:
    """Avro single-object encoding of ``SynthEvent`` tuples, specialised to event schema ``WRITER_VERSION``."""

    def __init__(self) -> None:
        schema = get_version(WRITER_VERSION)
        envelope = [f["name"] for f in schema.raw["fields"]]
        if envelope != list(ENVELOPE):
            raise RuntimeError(f"event schema v{WRITER_VERSION} changed its envelope; FastEncoder needs an update")
        kinds = list(schema.payload_kinds)
        self.header = schema.header
        self.kind_prefix = {kind: avro_str(kind) for kind in kinds}
        self.branch = {kind: varint(i) for i, kind in enumerate(kinds)}
        self.source = {s: varint(i) for i, s in enumerate(SOURCES)}
        self.kind_source = {(k, s): self.kind_prefix[k] + self.source[s] for k in kinds for s in SOURCES}
        self.payload = {
            "session_start": self._session_start,
            "agent_input": self._agent_input,
            "agent_action": self._agent_action,
            "env_feedback": self._env_feedback,
            "resource_sample": self._resource_sample,
            "file_op": self._file_op,
            "network_request": self._network_request,
            "evaluation": self._evaluation,
            "session_end": self._session_end,
        }
        self._str_cache: dict[str, bytes] = {}

    def s(self, text: str) -> bytes:
        """A (cached) Avro string: pools repeat, so most strings are encoded once."""
        cached = self._str_cache.get(text)
        if cached is None:
            cached = avro_str(text)
            if len(self._str_cache) < 200_000:
                self._str_cache[text] = cached
        return cached

    def os_(self, text: str | None) -> bytes:
        """A cached optional string."""
        return b"\x00" if text is None else b"\x02" + self.s(text)

    def encode(self, head: SessionHeader, ev: SynthEvent) -> bytes:
        """One event's single-object bytes."""
        kind, source, ts, seq, event_id, message_id, parent, extra, p = ev
        return b"".join(
            (
                self.header,
                head.id_bytes,
                SEQ_HEX[seq] if seq < 4096 else f"{seq:08x}".encode(),
                head.encoded_sid,
                VARINTS[seq] if seq < VARINT_CACHE_SIZE else zigzag(seq),
                ts_varint(ts),
                self.kind_source[kind, source],
                head.encoded_env,
                b"\x00" if message_id is None else b"\x02" + self.s(message_id),
                b"\x00" if parent is None else b"\x02\x40" + parent.encode(),
                head.encoded_extra if extra is None else avro_map({**head.extra, **extra}),
                self.branch[kind],
                self.payload[kind](p),
            )
        )

    def _session_start(self, p: tuple) -> bytes:
        attempt, cpu, mem, pids, timeout, net, allow, digest, instruction = p
        allow_bytes = (varint(len(allow)) + b"".join(self.s(a) for a in allow) + b"\x00") if allow else b"\x00"
        return b"".join(
            (
                varint(attempt),
                _DOUBLE(cpu),
                varint(mem),
                varint(pids),
                _DOUBLE(timeout),
                b"\x01" if net else b"\x00",
                allow_bytes,
                self.s(digest),
                self.os_(instruction),
            )
        )

    def _agent_input(self, p: tuple) -> bytes:
        digest, tokens, cached, n_messages, content = p
        return b"".join((avro_str(digest), varint(tokens), varint(cached), varint(n_messages), self.os_(content)))

    def _agent_action(self, p: tuple) -> bytes:
        tool, call_id, arguments, command, thought, out_tokens, reasoning, cost, latency = p
        return b"".join(
            (
                self.s(tool),
                self.s(call_id),
                self.s(arguments),
                self.os_(command),
                self.os_(thought),
                varint(out_tokens),
                varint(reasoning),
                _DOUBLE(cost),
                _DOUBLE(latency),
            )
        )

    def _env_feedback(self, p: tuple) -> bytes:
        call_id, output, exit_code, duration, truncated, size, reason, ref = p
        ref_bytes = b"\x00" if ref is None else b"\x02" + self.s(ref[0]) + varint(ref[1]) + self.s(ref[2])
        return b"".join(
            (
                self.s(call_id),
                self.s(output),
                b"\x00" if exit_code is None else b"\x02" + varint(exit_code),
                _DOUBLE(duration),
                b"\x01" if truncated else b"\x00",
                varint(size),
                self.os_(reason),
                ref_bytes,
            )
        )

    def _resource_sample(self, p: tuple) -> bytes:
        cpu, mem, procs, disk, net = p
        return b"".join((_DOUBLE(cpu), varint(mem), varint(procs), varint(disk), varint(net)))

    def _file_op(self, p: tuple) -> bytes:
        op, path, size, sha, in_ws = p
        return b"".join((self.s(op), self.s(path), varint(size), self.os_(sha), b"\x01" if in_ws else b"\x00"))

    def _network_request(self, p: tuple) -> bytes:
        host, port, protocol, allowed, sent, error = p
        return b"".join(
            (
                self.s(host),
                varint(port),
                self.s(protocol),
                b"\x01" if allowed else b"\x00",
                varint(sent),
                self.os_(error),
            )
        )

    def _evaluation(self, p: tuple) -> bytes:
        passed, total, n_passed, reward, fresh, evaluator, duration, details = p
        return b"".join(
            (
                b"\x01" if passed else b"\x00",
                varint(total),
                varint(n_passed),
                _DOUBLE(reward),
                b"\x01" if fresh else b"\x00",
                self.s(evaluator),
                _DOUBLE(duration),
                self.os_(details),
            )
        )

    def _session_end(self, p: tuple) -> bytes:
        status, reward, runtime, reason, cpu, mem, procs, disk = p
        return b"".join(
            (
                self.s(status),
                b"\x00" if reward is None else b"\x02" + _DOUBLE(reward),
                _DOUBLE(runtime),
                self.os_(reason),
                _DOUBLE(cpu),
                varint(mem),
                varint(procs),
                varint(disk),
            )
        )


def to_dict(head: SessionHeader, ev: SynthEvent) -> dict[str, Any]:
    """The same event as an SDK-style dict."""
    kind, source, ts, seq, event_id, message_id, parent, extra, payload = ev
    fields = payload_fields()[kind]
    p = dict(zip(fields, payload, strict=True))
    if kind == "session_start":
        p["egress_allowlist"] = list(p["egress_allowlist"])
    if kind == "env_feedback" and p["output_ref"] is not None:
        uri, size, sha = p["output_ref"]
        p["output_ref"] = {"uri": uri, "size_bytes": size, "sha256": sha}
    return {
        "event_id": event_id,
        "session_id": head.session_id,
        "seq": seq,
        "ts": ts,
        "event_type": kind,
        "source": source,
        **head.values,
        "agent_message_id": message_id,
        "parent_event_id": parent,
        "extra": {**head.extra, **(extra or {})},
        "payload": p,
    }
