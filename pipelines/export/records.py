"""One session's records in the format an export asks for (the formats: :mod:`pipelines.export.formats`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from common.prices import PriceTable
from pipelines.errors import ExportError
from pipelines.export.atif import atif_record
from pipelines.export.conversation import Conversation
from pipelines.export.formats import FORMATS, metadata, sft_messages, sharegpt_conversations, strip_nulls
from pipelines.export.rl import rl_records


def to_records(
    fmt: str, session: dict[str, Any], conversation: Conversation, prices: PriceTable | None = None
) -> list[dict[str, Any]]:
    """The records of ``session`` in format ``fmt`` (text fields redacted by the caller): one, or one per rl segment.

    Raises:
        ExportError: an unknown format.
        RecordError: an rl record of a session never evaluated (no reward).
    """
    prices = prices or PriceTable()
    meta = metadata(session, conversation)
    if fmt in ("hf", "openai", "sharegpt"):
        # a supervised example ends on the agent's last turn, every tool it calls defined
        messages, tools = sft_messages(session, conversation)
        # ``completion`` (and ``prompt``) name the prompt-completion format to TRL and other SFT loaders:
        # the quality component goes by ``completion_score`` here, so the record reads as a conversation
        meta = {("completion_score" if k == "completion" else k): v for k, v in meta.items()}
        if fmt == "hf":
            return [{"messages": messages, "tools": tools, **meta}]
        if fmt == "openai":
            return [{"messages": strip_nulls(messages), "tools": tools, **meta}]
        # ShareGPT keeps its tools as one JSON string (what LLaMA-Factory's sharegpt loader reads)
        trimmed = replace(conversation, messages=messages, tools=tools)
        return [{"conversations": sharegpt_conversations(trimmed), "tools": json.dumps(tools, sort_keys=True), **meta}]
    if fmt == "rl":
        return rl_records(session, conversation)
    if fmt == "atif":
        return [atif_record(session, conversation, prices)]
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")


def to_record(fmt: str, session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """The first record of ``session`` in ``fmt`` (see :func:`to_records`)."""
    return to_records(fmt, session, conversation)[0]
