"""How a model call is recorded: content-addressed messages, a delta per call, token ids as a suffix.

The design (schema v3, ``AgentInput.model_call``):

- Every request message and the tool definitions are serialised canonically
  (:func:`canonical`: sorted keys, no spaces, UTF-8) and addressed by the sha256 of those bytes.
- A call's event carries ``prefix_messages`` (how many leading messages equal the previous
  call's request messages followed by its response message) and ``new_messages`` (the refs
  of the rest). In an agent loop each call appends one assistant and a few tool messages,
  so an event holds O(new content), not the whole context.
- ``blobs`` carries the text of every ref the :class:`ContentStore` had not emitted before. The
  store is shared by every session of a fleet (one per host process), so a system prompt or
  tool list sent by thousands of sessions is stored once.
- Prompt token ids are stored as ``prompt_token_ids_shared`` (leading ids equal to the previous
  call's prompt + completion ids) and the remaining ids; completion ids and logprobs whole.
- Schema v4 adds where the ids come from: ``token_mode`` (``chat``: messages sent, the server's
  template renders them; ``tito``: the conversation kept as ids and sent as ids), ``engine`` (the
  response shape the ids were read from: ``vllm``, ``sglang``, ``llama.cpp``, or ``openai`` for a
  server that returns none) and ``record_level`` (``token`` when the call has completion ids,
  ``message`` when the server gave only text).

:func:`reconstruct` turns one session's recorded calls back into exact request messages and
prompt token ids. Caveat: blob texts pass through the producer's secret redaction like every
event string, so a blob that held a secret no longer matches its sha256 (the digest is of what
the model was sent); and a blob is in the event of the first session that sent it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value`` (what is hashed and stored)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode()).hexdigest()


def request_digest(refs: Sequence[str]) -> str:
    """sha256 of a request's messages: of their refs joined by newlines (O(refs), not O(content))."""
    return sha256_text("\n".join(refs))


class ContentStore:
    """Which content refs a host has emitted (thread-safe, bounded LRU).

    Args:
        capacity: refs remembered; past it the least recently used is forgotten (and re-emitted if
            seen again), so memory stays bounded on a long-lived host.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, ref: str) -> bool:
        """True (and remember it) when ``ref`` was not emitted before."""
        with self._lock:
            if ref in self._seen:
                self._seen.move_to_end(ref)
                return False
            self._seen[ref] = None
            if len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
            return True


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (an agent loop appends), compared in C
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CallRecorder:
    """Builds the ``model_call`` records of one session, each relative to the previous call.

    Args:
        store: the host's content store.
    """

    store: ContentStore
    calls: int = 0
    _context: list[str] = field(default_factory=list)  # previous request refs + its response ref
    _token_context: list[int] = field(default_factory=list)  # previous prompt + completion ids
    # id(message) -> (message, canonical text, ref): a message object sent again is not serialised again,
    # so a call costs O(new messages); the object is kept so its id cannot be reused
    _memo: dict[int, tuple[Any, str, str]] = field(default_factory=dict)

    def _ref(self, value: Any, blobs: list[dict[str, str]], pending: set[str]) -> str:
        memo = self._memo.get(id(value))
        if memo is not None and memo[0] is value:  # a message is not changed once sent (the loop appends)
            text, ref = memo[1], memo[2]
        else:
            text = canonical(value)
            ref = sha256_text(text)
            self._memo[id(value)] = (value, text, ref)
        if ref not in pending and self.store.first_time(ref):
            blobs.append({"sha256": ref, "text": text})
            pending.add(ref)
        return ref

    def record(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        model: str,
        sampling: Mapping[str, Any],
        response: Mapping[str, Any] | None,
        latency_ms: float,
        try_index: int = 0,
        http_status: int | None = None,
        error: str | None = None,
        cost_usd: float | None = None,
        token_mode: str = "chat",
        engine: str | None = None,
    ) -> dict[str, Any]:
        """The ``model_call`` record of one try of one call (a failed try too: ``error`` set).

        Only a successful try advances the delta base (the next call is relative to it).

        Args:
            token_mode: ``chat`` or ``tito`` (how the prompt was sent).
            engine: the server kind; ``None`` guesses it from the response's shape.
        """
        blobs: list[dict[str, str]] = []
        pending: set[str] = set()
        refs = [self._ref(m, blobs, pending) for m in messages]
        record = self._request_record(
            refs,
            self._ref(list(tools), blobs, pending) if tools else None,
            blobs,
            model=model,
            sampling=sampling,
            try_index=try_index,
            http_status=http_status,
            error=error,
            latency_ms=latency_ms,
            cost_usd=cost_usd,
            token_mode=token_mode,
            engine=engine,
        )
        if error is not None or response is None:
            return record
        self._take_response(record, response, engine, blobs, pending)
        self._context = [*refs, record["response_message_sha256"]]
        self.calls += 1
        return record

    def _request_record(
        self,
        refs: list[str],
        tools_ref: str | None,
        blobs: list[dict[str, str]],
        *,
        model: str,
        sampling: Mapping[str, Any],
        try_index: int,
        http_status: int | None,
        error: str | None,
        latency_ms: float,
        cost_usd: float | None,
        token_mode: str,
        engine: str | None,
    ) -> dict[str, Any]:
        """The record as the request makes it: the messages relative to the previous call, every response
        field empty."""
        prefix = _common_prefix(self._context, refs)
        return {
            "call_index": self.calls,
            "model": model,
            "response_model": None,
            "response_id": None,
            "sampling_params": canonical(dict(sampling)),
            "tools_sha256": tools_ref,
            "prefix_messages": prefix,
            "new_messages": refs[prefix:],
            "request_sha256": request_digest(refs),  # of the refs: O(messages), not O(content)
            "n_messages": len(refs),
            "blobs": blobs,
            "status": "ok" if error is None else "error",
            "try_index": try_index,
            "http_status": http_status,
            "error": error,
            "finish_reason": None,
            "response_message_sha256": None,
            "prompt_tokens": None,
            "completion_tokens": None,
            "cached_tokens": None,
            "reasoning_tokens": None,
            "latency_ms": round(latency_ms, 3),
            "cost_usd": cost_usd,
            "prompt_token_ids_shared": None,
            "prompt_token_ids": [],
            "completion_token_ids": [],
            "completion_logprobs": [],
            "completion_tokens_text": [],
            "token_mode": token_mode,
            "engine": engine,
            "record_level": None,
        }

    def _take_response(
        self,
        record: dict[str, Any],
        response: Mapping[str, Any],
        engine: str | None,
        blobs: list[dict[str, str]],
        pending: set[str],
    ) -> None:
        """Fill ``record``'s response fields from a successful try's ``response``; its prompt token ids are
        kept relative to the previous call's, which they become the base of."""
        parsed = parse_response(response)
        record.update(
            engine=engine or parsed.engine,
            record_level="token" if parsed.completion_token_ids else "message",
            response_model=response.get("model"),
            response_id=response.get("id"),
            finish_reason=parsed.finish_reason,
            response_message_sha256=self._ref(parsed.message, blobs, pending),
            prompt_tokens=parsed.usage.get("prompt_tokens"),
            completion_tokens=parsed.usage.get("completion_tokens"),
            cached_tokens=parsed.usage.get("cached_tokens"),
            reasoning_tokens=parsed.usage.get("reasoning_tokens"),
            completion_token_ids=parsed.completion_token_ids,
            completion_logprobs=parsed.logprobs,
            completion_tokens_text=parsed.tokens,
        )
        if parsed.prompt_token_ids is not None:
            shared = _common_prefix(self._token_context, parsed.prompt_token_ids)
            record["prompt_token_ids_shared"] = shared
            record["prompt_token_ids"] = parsed.prompt_token_ids[shared:]
            self._token_context = parsed.prompt_token_ids + parsed.completion_token_ids


@dataclass
class ParsedResponse:
    """The parts of a chat-completions response the agent and the recorder use."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, int | None]
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    engine: str = "openai"


def assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant reply as recorded: role, content, tool calls, and the reasoning of a reasoning model.

    The reasoning is ``reasoning_content`` (DeepSeek, SGLang, LiteLLM) or ``reasoning`` (vLLM); it is
    kept under ``reasoning_content``. What goes back into the next request is :func:`request_message`.
    """
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in message["tool_calls"]
        ]
    return out


def request_message(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The reply as it goes back into the next request: without its reasoning (providers reject or ignore it)."""
    return {k: v for k, v in reply.items() if k != "reasoning_content"}


def _entry_id(entry: Mapping[str, Any]) -> int | None:
    """A logprobs entry's token id: llama.cpp's ``id``, some servers' ``token_id``, vLLM's ``token_id:N`` token."""
    for key in ("id", "token_id"):
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    token = entry.get("token")
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].lstrip("-").isdigit():
        return int(token[9:])
    return None


def parse_response(response: Mapping[str, Any]) -> ParsedResponse:
    """Read a chat-completions response with the token ids of whichever server sent it.

    Token ids come from ``choices[0].token_ids`` and ``prompt_token_ids`` (top level or in the
    choice: vLLM's ``return_token_ids``), else from the ``logprobs.content[]`` entries: llama.cpp's
    ``id`` or vLLM's ``token_id:N`` tokens (``return_tokens_as_token_ids``). A server that gives
    neither (SGLang's and OpenAI's chat endpoints) leaves the ids empty: a message-level record.
    """
    choice = (response.get("choices") or [{}])[0]
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    content = (choice.get("logprobs") or {}).get("content") or []
    tokens = [str(entry.get("token", "")) for entry in content]
    logprobs = [float(entry.get("logprob", 0.0)) for entry in content]
    completion_ids = choice.get("token_ids")
    engine = "vllm" if completion_ids is not None else "openai"
    if completion_ids is None and content:
        entry_ids = [_entry_id(entry) for entry in content]
        if all(i is not None for i in entry_ids):
            completion_ids = entry_ids
            engine = "llama.cpp" if all("id" in entry for entry in content) else "vllm"
            counted = usage.get("completion_tokens")
            if isinstance(counted, int) and len(entry_ids) < counted:
                # llama.cpp's chat logprobs have no entry for a token that ends inside a multi-byte
                # character (its bytes go out with the next entry): the ids are incomplete and the
                # logprobs misaligned, so the call is recorded at message level, never as a partial
                # sequence (exact ids from llama.cpp: --token-mode tito, whose /completion returns all)
                completion_ids, logprobs, tokens = [], [], []
    prompt_ids = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
    if prompt_ids is not None:
        engine = "vllm"
    if "timings" in response:  # llama.cpp reports its timings with every completion
        engine = "llama.cpp"
    return ParsedResponse(
        message=assistant_message(choice.get("message") or {}),
        finish_reason=choice.get("finish_reason"),
        usage={
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": details.get("cached_tokens"),
            "reasoning_tokens": completion_details.get("reasoning_tokens"),
        },
        prompt_token_ids=[int(i) for i in prompt_ids] if prompt_ids is not None else None,
        completion_token_ids=[int(i) for i in completion_ids or []],
        logprobs=logprobs,
        tokens=tokens,
        engine=engine,
    )


#: Where servers put facts about themselves in a chat-completions body: top level, SGLang's
#: ``meta_info``, a ``metadata`` object.
_SELF_REPORT = ("", "meta_info", "metadata")


def _reported(response: Mapping[str, Any], key: str) -> Any:
    for place in _SELF_REPORT:
        holder = response.get(place) if place else response
        if isinstance(holder, Mapping) and holder.get(key) not in (None, ""):
            return holder[key]
    return None


def served_by(response: Mapping[str, Any]) -> dict[str, str]:
    """What the server said about the weights and the engine that sampled this reply (only what it said).

    ``policy_version``: the weights' version (SGLang's ``weight_version``, or ``policy_version``),
    so an asynchronous trainer can drop or down-weight turns sampled by stale weights;
    ``engine`` and ``dtype`` where the server names them; ``system_fingerprint`` (OpenAI, vLLM).
    """
    out: dict[str, str] = {}
    version = _reported(response, "weight_version") or _reported(response, "policy_version")
    if version is not None:
        out["policy_version"] = str(version)
    for key in ("engine", "dtype", "system_fingerprint"):
        value = _reported(response, key)
        if value is not None:
            out[key] = str(value)
    return out


def server_cost(response: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> float | None:
    """The cost the server reported for this call (OpenRouter ``usage.cost``, a LiteLLM proxy's
    ``x-litellm-response-cost`` header), None when it reported none."""
    usage = response.get("usage") or {}
    value = usage.get("cost") if isinstance(usage, Mapping) else None
    if value is None and headers:
        value = next((v for k, v in headers.items() if k.lower() == "x-litellm-response-cost"), None)
    try:
        cost = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return cost if cost is not None and cost >= 0 and cost == cost and cost != float("inf") else None


@dataclass
class Reconstructed:
    """One successful call, rebuilt from the event stream."""

    call_index: int
    messages: list[Any]
    tools: list[Any] | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int]
    completion_logprobs: list[float]


def reconstruct(calls: Iterable[Mapping[str, Any]], blobs: Mapping[str, str] | None = None) -> list[Reconstructed]:
    """Rebuild a session's requests from its ``model_call`` records (in ``call_index`` order).

    Args:
        calls: the session's ``model_call`` records; failed tries (``status='error'``) are skipped.
        blobs: sha256 → text of blobs from other sessions (the host stored them once); each
            record's own blobs are added.

    Returns:
        One entry per successful call.

    Raises:
        KeyError: a ref whose blob is nowhere in ``blobs`` or the records.
        ValueError: a rebuilt request whose sha256 differs from the recorded ``request_sha256``.
    """
    every = list(calls)
    ok = sorted((c for c in every if c.get("status") == "ok"), key=lambda c: c["call_index"])
    texts = dict(blobs or {})
    for call in every:  # a failed try may have introduced a blob the successful retry refers to
        texts.update({b["sha256"]: b["text"] for b in call.get("blobs") or []})
    out: list[Reconstructed] = []
    context: list[str] = []
    token_context: list[int] = []
    for call in ok:
        refs = context[: call["prefix_messages"]] + list(call["new_messages"])
        messages = [json.loads(texts[ref]) for ref in refs]
        if request_digest([sha256_text(canonical(m)) for m in messages]) != call["request_sha256"]:
            raise ValueError(f"call {call['call_index']}: rebuilt request does not match its sha256")
        prompt_ids = None
        if call.get("prompt_token_ids_shared") is not None:
            prompt_ids = token_context[: call["prompt_token_ids_shared"]] + list(call["prompt_token_ids"])
            token_context = prompt_ids + list(call["completion_token_ids"])
        tools = json.loads(texts[call["tools_sha256"]]) if call.get("tools_sha256") else None
        out.append(
            Reconstructed(
                call["call_index"],
                messages,
                tools,
                prompt_ids,
                list(call["completion_token_ids"]),
                list(call["completion_logprobs"]),
            )
        )
        context = [*refs, call["response_message_sha256"]]
    return out
