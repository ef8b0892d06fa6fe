"""Texts too large for one event travel in parts: the event keeps the head, annotations carry the rest.

Ingest dead-letters a record above ``TRAJLAKE_MAX_EVENT_BYTES`` (1 MiB by default), yet an agent's
submission, a tool's output or a task statement can be larger. Nothing is cut: when an event's
texts exceed :data:`EVENT_TEXT_BUDGET`, its largest text fields are split at UTF-8 character
boundaries into parts of at most :data:`PART_BYTES` bytes:

* the field keeps part 0 (an ``env_feedback`` output also gets ``output_ref`` with the whole's
  size and sha256, URI ``parts:<sha256>``); the event's ``extra['parts_of']`` lists such fields;
* every further part is an ``annotation`` event (schema v4) right after it, ``parent_event_id``
  the event, ``key`` ``part``, ``value`` the text, ``part_of_field`` the field
  (``env_feedback.output``, ``agent_action.thought``, …), ``part_index`` / ``part_count`` and the
  whole text's ``whole_sha256``;
* a model call's content blob (``agent_input.model_call.blobs``) leaves the event whole: all its
  parts are annotations with ``part_of_field = 'blob'`` and ``whole_sha256`` its content ref.

Assembly puts the whole texts back (``pipelines.intake.parts``) into ``steps`` and ``trajectories``, after
checking each whole against its sha256; export reads blobs the same way. Part event ids derive from
the parent's id, so re-sending a session re-sends the same parts.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Iterable
from typing import Any

#: Bytes of one part (a quarter of ingest's default record limit).
PART_BYTES = 256 * 1024
#: An event whose texts sum to more than this is split (headroom for the envelope and Avro framing).
EVENT_TEXT_BUDGET = 640 * 1024
#: Namespace of the part events' ids.
PARTS_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://trajlake/parts")
#: The text fields that may be split, per event type (in the order they are tried after size).
SPLITTABLE: dict[str, tuple[str, ...]] = {
    "env_feedback": ("output", "failure_reason"),
    "agent_action": ("thought", "arguments", "command"),
    "session_start": ("instruction",),
    "agent_input": ("content",),
    "evaluation": ("details",),
    "session_end": ("exit_reason",),
}
BLOB_FIELD = "blob"


#: Characters encoded at a time when a long text is measured or hashed (no encoded copy of the whole).
CHUNK_CHARS = 1 << 18


def utf8_len(text: str, errors: str = "strict") -> int:
    """``len(text.encode("utf-8", errors))`` without the encoded copy (ASCII text: its length)."""
    if text.isascii():
        return len(text)
    if len(text) <= CHUNK_CHARS:
        return len(text.encode("utf-8", errors))
    return sum(len(text[i : i + CHUNK_CHARS].encode("utf-8", errors)) for i in range(0, len(text), CHUNK_CHARS))


def text_sha256(text: str) -> str:
    """The hex sha256 of ``text``'s UTF-8 bytes, encoded a slice at a time."""
    digest = hashlib.sha256()
    for i in range(0, len(text), CHUNK_CHARS):
        digest.update(text[i : i + CHUNK_CHARS].encode())
    return digest.hexdigest()


def split_utf8(text: str, part_bytes: int = PART_BYTES) -> list[str]:
    """``text`` in pieces of at most ``part_bytes`` UTF-8 bytes, cut between characters; joined, exactly ``text``.

    Each piece is the longest run of characters that fits; only one piece's worth is encoded at a time
    (ASCII text is sliced as it is), so splitting a large text costs its pieces and no second copy.
    """
    if text.isascii():
        return [text[i : i + part_bytes] for i in range(0, len(text), part_bytes)] or [text]
    pieces = []
    start = 0
    while start < len(text):
        window = text[start : start + part_bytes]  # at least part_bytes bytes, unless it is the rest
        data = window.encode()
        if len(data) > part_bytes:
            end = part_bytes
            while (data[end] & 0xC0) == 0x80:  # never inside a multi-byte character
                end -= 1
            window = data[:end].decode()
        pieces.append(window)
        start += len(window)
    return pieces


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string in ``value`` (keys included), walked without recursion."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += utf8_len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def _part_event(parent: dict[str, Any], field: str, index: int, count: int, text: str, whole: str) -> dict[str, Any]:
    envelope = {k: v for k, v in parent.items() if k not in ("payload", "event_id", "event_type", "source")}
    return {
        **envelope,
        "event_id": uuid.uuid5(PARTS_NAMESPACE, f"{parent['event_id']}/{field}/{whole}/{index}").hex,
        "event_type": "annotation",
        "source": "system",
        "agent_message_id": None,
        "parent_event_id": parent["event_id"],
        "payload": {
            "key": "part",
            "value": text,
            "author": None,
            "part_of_field": field,
            "part_index": index,
            "part_count": count,
            "whole_sha256": whole,
        },
    }


def split_event(
    event: dict[str, Any], budget: int = EVENT_TEXT_BUDGET, part_bytes: int = PART_BYTES
) -> list[dict[str, Any]]:
    """``event`` followed by the part annotations its large texts need (just ``[event]`` when it fits).

    ``seq`` of the returned events is left to the caller (parts need numbers of their own).
    """
    if _text_bytes(event) <= budget:
        return [event]
    event = copy.copy(event)
    payload = event["payload"] = dict(event["payload"])
    kind = str(event["event_type"])
    parts: list[dict[str, Any]] = []
    split_fields: list[str] = []
    size = _text_bytes(event)
    blobs = _blobs_by_size(payload)
    for blob in blobs:  # the largest blobs leave first: a model call's new content is what grows
        if size <= budget:
            break
        whole = blob["sha256"]
        pieces = split_utf8(blob["text"], part_bytes)
        parts += [_part_event(event, BLOB_FIELD, i, len(pieces), p, whole) for i, p in enumerate(pieces)]
        call = payload["model_call"]
        call["blobs"] = [b for b in call["blobs"] if b is not blob]
        size -= utf8_len(blob["text"])
    candidates = sorted(
        (name for name in SPLITTABLE.get(kind, ()) if isinstance(payload.get(name), str)),
        key=lambda name: -len(payload[name]),
    )
    for name in candidates:
        if size <= budget:
            break
        text = payload[name]
        pieces = split_utf8(text, part_bytes)
        if len(pieces) == 1:
            continue
        data_size = utf8_len(text)
        whole = text_sha256(text)
        payload[name] = pieces[0]
        field = f"{kind}.{name}"
        split_fields.append(field)
        parts += [_part_event(event, field, i, len(pieces), p, whole) for i, p in enumerate(pieces) if i > 0]
        if kind == "env_feedback" and name == "output":
            payload["output_bytes"] = max(int(payload.get("output_bytes") or 0), data_size)
            payload["output_ref"] = {"uri": f"parts:{whole}", "size_bytes": data_size, "sha256": whole}
        size -= data_size - utf8_len(pieces[0])
    if split_fields:
        event["extra"] = {**(event.get("extra") or {}), "parts_of": ",".join(split_fields)}
    return [event, *parts]


def _blobs_by_size(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The model call's blobs, largest first (the call is copied: the caller removes some)."""
    call = payload.get("model_call")
    if not isinstance(call, dict):
        return []
    call = payload["model_call"] = dict(call)
    call["blobs"] = list(call.get("blobs") or [])
    blobs = [b for b in call["blobs"] if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return sorted(blobs, key=lambda b: -len(b["text"]))


def split_session(events: Iterable[dict[str, Any]], budget: int = EVENT_TEXT_BUDGET) -> list[dict[str, Any]]:
    """One session's events with every oversized text split into parts, ``seq`` renumbered from 0.

    The events must be one session's, in emission order (what ``SessionEmitter`` produced).
    """
    out: list[dict[str, Any]] = []
    for event in events:
        out.extend(split_event(event, budget))
    return _renumbered(out)


def split_session_consuming(events: list[dict[str, Any]], budget: int = EVENT_TEXT_BUDGET) -> list[dict[str, Any]]:
    """:func:`split_session`, emptying ``events`` as it goes: each event is let go once its parts are made.

    The last event is split first. A model call's blob repeats the tool output of an event before it,
    whose text the record being imported still holds: the blob, split first, goes before the output's
    parts are made, so the two never add up to a third copy of the text.
    """
    pieces: list[list[dict[str, Any]]] = []
    while events:
        pieces.append(split_event(events.pop(), budget))
    pieces.reverse()
    return _renumbered([event for piece in pieces for event in piece])


def _renumbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e if e["seq"] == i else {**e, "seq": i} for i, e in enumerate(events)]
