"""The executor's reply, read on the host without trusting its framing.

The executor (``image/tl_exec.py``, the sandbox's init) answers each request with one header line
of ``EXEC_FIELDS`` and then the failure reason and the output, whose lengths the header gives.
Commands cannot write to that channel (the executor is non-dumpable and holds it alone), but the
host still reads it as it reads everything from a sandbox: a header that is not exactly the
fields, a number that is not one (or not finite, or out of its range), a length past the bounds,
a digest that is not hex, or fewer bytes than announced is a broken channel (``ExecChannelBroken``):
the host kills the sandbox, and nothing read from it is used. The lengths are bounded before
anything is read, so a reply can neither make the host allocate without limit nor wait for
bytes that never come.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import IO

from producers.errors import SandboxKilled

#: Longest header line read (a dozen numbers and a digest).
MAX_HEADER_BYTES = 1024
#: Longest failure reason and output the host takes (the executor sends at most its output limit).
MAX_REASON_BYTES = 4096
MAX_OUTPUT_BYTES = 16 << 20
#: ``exit_code`` is an Avro int in the event schema; a process status is far smaller anyway.
INT32 = 1 << 31
_HEX = re.compile(rb"[0-9a-f]+")


class ExecChannelBroken(SandboxKilled):
    """The executor's reply is not a reply: the channel is out of step and the sandbox is killed."""


@dataclass(frozen=True)
class Reply:
    """One reply of the executor, every field checked."""

    nonce: str
    exit_code: int
    duration_ms: float
    output_bytes: int
    truncated: bool
    telemetry: dict[str, float]
    sha256: str
    reason: bytes
    output: bytes


def _number(raw: bytes, name: str, low: float, high: float, integer: bool) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ExecChannelBroken(f"reply field {name} is not a number: {raw[:40]!r}") from None
    if not math.isfinite(value) or not low <= value < high:
        raise ExecChannelBroken(f"reply field {name} out of range: {raw[:40]!r}")
    return value


def parse_header(line: bytes, fields: tuple[str, ...]) -> dict[str, bytes]:
    """The header's raw fields by name.

    Raises:
        ExecChannelBroken: not exactly ``fields``, space-separated, on one line.
    """
    if len(line) > MAX_HEADER_BYTES or not line.endswith(b"\n"):
        raise ExecChannelBroken(f"reply header of {len(line)} bytes without its end")
    parts = line.split()
    if len(parts) != len(fields):
        raise ExecChannelBroken(f"reply header with {len(parts)} fields, not {len(fields)}")
    return dict(zip(fields, parts, strict=True))


def read_reply(stream: IO[bytes], fields: tuple[str, ...]) -> Reply | None:
    """One reply from the executor's stdout (``None``: the stream ended before a header: the sandbox is gone).

    Raises:
        ExecChannelBroken: the bytes are not a reply (see the module docstring).
        OSError: the stream failed.
    """
    line = stream.readline(MAX_HEADER_BYTES + 1)
    if not line:
        return None
    raw = parse_header(line, fields)
    reason_len = int(_number(raw["reason_len"], "reason_len", 0, MAX_REASON_BYTES + 1, True))
    output_len = int(_number(raw["output_len"], "output_len", 0, MAX_OUTPUT_BYTES + 1, True))
    if raw["truncated"] not in (b"0", b"1"):
        raise ExecChannelBroken(f"reply field truncated is {raw['truncated'][:10]!r}")
    if not _HEX.fullmatch(raw["nonce"]):  # the host's nonces are hex: this answers no request of the host's
        raise ExecChannelBroken(f"a reply that does not answer the request (nonce {raw['nonce'][:20]!r})")
    if not _HEX.fullmatch(raw["sha256"]) or len(raw["sha256"]) != 64:
        raise ExecChannelBroken("reply digest is not a sha256")
    telemetry = {k: _number(raw[k], k, 0, 1e15, False) for k in ("cpu_s", "maxrss_kb", "oublock", "procs")}
    reply = Reply(
        nonce=raw["nonce"].decode(),
        exit_code=int(_number(raw["exit_code"], "exit_code", -INT32, INT32, True)),
        duration_ms=_number(raw["duration_ms"], "duration_ms", 0, 1e15, False),
        output_bytes=int(_number(raw["output_bytes"], "output_bytes", 0, 1 << 62, True)),
        truncated=raw["truncated"] == b"1",
        telemetry=telemetry,
        sha256=raw["sha256"].decode(),
        reason=stream.read(reason_len),
        output=stream.read(output_len),
    )
    if len(reply.reason) != reason_len or len(reply.output) != output_len:
        raise ExecChannelBroken("the reply ended before the lengths its header gave")
    return reply
