"""Building one imported session's events: deterministic ids and time, typed payloads, linear model calls.

Every importer turns one recorded run into the events a live sandbox host would emit, through
:class:`RunBuilder`. What makes a re-import idempotent downstream: the session id and every event
id are uuid5 values derived from the record's sha256 (and the run's position in it), so the same
bytes always give the same ids (ingest and assembly deduplicate by event id). A run's own id (an
ATIF ``session_id``, an OpenHands conversation id) is kept in ``extra['source_session_id']``, never
used as the session id: an imported file cannot claim a session another producer owns.

:meth:`RunBuilder.finish` makes the session safe to send whole: every field within its Avro range
(:mod:`producers.importers._values`), secrets redacted, texts too large for one event split into
parts (:mod:`producers.parts`).
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from producers.importers._source import SourceFile
from producers.importers._values import FieldIssues, conform_event
from producers.parts import split_session_consuming, text_sha256, utf8_len
from producers.redact import redact_session
from producers.sdk import Event, SessionEmitter
from schemas import typed

# Namespace of every imported id (uuid5 of a fixed name, so it never changes between releases).
IMPORT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://trajlake/importers")
# Formats without timestamps get a synthetic clock from this fixed instant (2024-01-01T00:00:00Z).
SYNTHETIC_EPOCH_US = 1_704_067_200_000_000
# One synthetic clock tick between consecutive events of a run without timestamps.
SYNTHETIC_TICK_US = 1_000
#: Whether :meth:`RunBuilder.finish` redacts secrets (off only to measure redaction itself).
REDACT: contextvars.ContextVar[bool] = contextvars.ContextVar("trajlake_import_redact", default=True)
#: ``extra['source_kind']`` of imported sessions (part of the producer identity assembly checks).
SOURCE_KIND = "import"
#: The source path of a conversation the OTLP receiver took in (no file: its origin is ``otlp``).
OTLP_SOURCE = Path("otlp")


class RunEnvelope(TypedDict, total=False):
    """What an importer knows of a run's envelope (``task_id`` and ``task_type`` at least)."""

    task_id: str
    task_type: str
    image_version: str
    agent_name: str | None
    agent_version: str | None
    agent_model: str | None
    policy_version: str | None


@dataclass(frozen=True)
class Verdict:
    """Whether a run solved its task, and who says so.

    Attributes:
        instance_id: the task (benchmark instance) the verdict is about.
        passed: solved or not.
        reward: the reward (1.0/0.0 for a pass/fail verdict unless the source gives one).
        provenance: ``harness_report``, ``harbor_verifier``, ``self_reported``, ``fleet_evaluator``.
        evaluator: what produced it (``swe-bench``, ``harbor``, ``openhands``, …).
        tests_total, tests_passed: test counts when the source has them.
        details: the source's own record (JSON), kept in the evaluation event.
        source: the file it came from.
    """

    instance_id: str
    passed: bool
    reward: float
    provenance: str
    evaluator: str
    tests_total: int = 0
    tests_passed: int = 0
    details: str | None = None
    source: str = ""


@dataclass
class ImportedSession:
    """One session of a recorded run, ready to send whole."""

    session_id: str
    framework: str
    events: list[Event]
    issues: FieldIssues
    position: str = ""

    @property
    def steps(self) -> int:
        """Agent actions of the session."""
        return sum(1 for e in self.events if e["event_type"] == "agent_action")

    @property
    def task_id(self) -> str:
        """The session's task (benchmark instance)."""
        return str(self.events[0]["task_id"]) if self.events else ""


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value``, as the fleet's call recorder writes it (what a blob holds)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """sha256 of a value's canonical JSON (sorted keys), e.g. of a run's configuration."""
    return text_sha256(json.dumps(value, sort_keys=True, default=str))


class CallLog:
    """The ``model_call`` records of one imported run, each O(new messages) to build.

    The same record shape as the fleet's recorder (``producers.fleet.llm.record``), so
    ``reconstruct`` rebuilds the exact requests; built incrementally because a recorded run's
    conversation only grows: the request digest is a running hash and each message is serialised
    once, so a run of n turns costs O(n), not O(n²).
    """

    def __init__(self) -> None:
        self._refs: list[str] = []
        self._base = 0  # how many refs the previous request + its reply had (the delta base)
        self._token_context: list[int] = []  # previous prompt + completion token ids
        self._hash = hashlib.sha256()
        self._emitted: set[str] = set()
        self._pending: list[typed.ContentBlob] = []
        self.calls = 0

    def _ref(self, value: Any) -> str:
        text = canonical(value)
        ref = text_sha256(text)
        if ref not in self._emitted:
            self._emitted.add(ref)
            self._pending.append({"sha256": ref, "text": text})
        return ref

    def append(self, message: Mapping[str, Any]) -> None:
        """Add a message to the conversation (what every later request carries)."""
        ref = self._ref(message)
        self._hash.update(("\n" if self._refs else "").encode() + ref.encode())
        self._refs.append(ref)

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Add several messages."""
        for message in messages:
            self.append(message)

    def extend_to(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Make the conversation ``messages``: append what is new when it extends the current one, else start over.

        For formats that record each call's whole request (OTel spans): a request that rewrote the
        history is recorded whole (its delta base is empty).
        """
        refs = [text_sha256(canonical(m)) for m in messages]
        known = len(self._refs)
        if refs[:known] != self._refs:
            self._refs, self._hash, self._base = [], hashlib.sha256(), 0
            known = 0
        self.extend(messages[known:])

    def record(
        self,
        reply: Mapping[str, Any],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        model: str,
        sampling: Mapping[str, Any],
        usage: Mapping[str, Any],
        finish_reason: str | None,
        response_id: str | None,
        prompt_token_ids: list[int] | None,
        completion_token_ids: list[int] | None,
        logprobs: list[float] | None,
        cost_usd: float | None,
    ) -> typed.ModelCall:
        """The record of a call whose request is the conversation so far and whose reply is ``reply``.

        The reply joins the conversation (the next request starts with it).
        """
        tools_ref = self._ref(list(tools)) if tools else None
        # the conversation only grows (messages are appended, never rewritten): the previous
        # request and its reply are exactly the first refs of this one
        prefix = self._base
        refs = self._refs
        reply_ref = self._ref(dict(reply))
        record: typed.ModelCall = {
            "call_index": self.calls,
            "model": model,
            "response_model": None,
            "response_id": response_id,
            "sampling_params": canonical(dict(sampling)),
            "tools_sha256": tools_ref,
            "prefix_messages": prefix,
            "new_messages": refs[prefix:],
            "request_sha256": self._hash.hexdigest() if refs else hashlib.sha256(b"").hexdigest(),
            "n_messages": len(refs),
            "blobs": self._pending,
            "status": "ok",
            "try_index": 0,
            "http_status": None,
            "error": None,
            "finish_reason": finish_reason,
            "response_message_sha256": reply_ref,
            "prompt_tokens": _int_or_none(usage.get("prompt_tokens")),
            "completion_tokens": _int_or_none(usage.get("completion_tokens")),
            "cached_tokens": _int_or_none((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            "reasoning_tokens": _int_or_none((usage.get("completion_tokens_details") or {}).get("reasoning_tokens")),
            "latency_ms": 0.0,
            "cost_usd": cost_usd,
            "prompt_token_ids_shared": None,
            "prompt_token_ids": [],
            "completion_token_ids": list(completion_token_ids or []),
            "completion_logprobs": list(logprobs or []),
            "completion_tokens_text": [""] * len(logprobs or []),
            # a recorded run's messages, as sent; the server kind is not recorded
            "token_mode": "chat",
            "engine": None,
            "record_level": "token" if completion_token_ids else "message",
        }
        if prompt_token_ids is not None:
            shared = _common_prefix(self._token_context, prompt_token_ids)
            record["prompt_token_ids_shared"] = shared
            record["prompt_token_ids"] = list(prompt_token_ids[shared:])
            self._token_context = [*prompt_token_ids, *(completion_token_ids or [])]
        self._pending = []
        self._base = len(refs) + 1
        self.calls += 1
        self.append(reply)
        return record


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (each prompt extends the last), compared in C
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class _Clock:
    """The time of the next event and the id it is given instead of its position (if any)."""

    now: int
    fixed_id: str | None = None


@dataclass
class RunBuilder:
    """Emits one imported session through ``SessionEmitter`` into a list, with deterministic ids and time.

    Args:
        source: the record being imported (its sha256 namespaces the ids).
        framework: the importer's name (``mini-swe-agent``, ``openhands``, ``otel``, …).
        source_format: the format as the file names it (e.g. ``mini-swe-agent-1.1``).
        envelope: ``task_id``, ``task_type``, ``image_version``, ``agent_*`` fields.
        key: which run of the record (several runs share one record: traces of one OTLP file).
        source_session_id: the run's own id, kept in ``extra`` (never the session id).
    """

    source: SourceFile
    framework: str
    source_format: str
    envelope: RunEnvelope
    key: str = ""
    source_session_id: str | None = None
    events: list[Event] = field(default_factory=list)
    issues: FieldIssues = field(default_factory=FieldIssues)

    def __post_init__(self) -> None:
        for where in self.source.repaired:
            self.issues.add(where, "unpaired surrogate replaced")
        namespace = uuid.uuid5(IMPORT_NAMESPACE, self.source.sha256)
        prefix = f"{self.key}/" if self.key else ""
        self.calls = CallLog()
        self._namespace = namespace
        counter = itertools.count()
        # the emitter's clock and ids read this, not the builder: no reference cycle keeps a finished
        # builder (and the record it read) alive until the garbage collector runs
        clock = self._clock = _Clock(SYNTHETIC_EPOCH_US)

        def new_id() -> str:
            if clock.fixed_id is not None:
                fixed, clock.fixed_id = clock.fixed_id, None
                return fixed
            return uuid.uuid5(namespace, f"{prefix}event/{next(counter)}").hex

        extra = {"source_format": self.source_format, "source_sha256": self.source.sha256, "source_kind": SOURCE_KIND}
        if self.source_session_id:
            extra["source_session_id"] = self.source_session_id
        envelope: dict[str, Any] = {"task_id": "unknown", "task_type": "imported", **self.envelope}
        self.emitter = SessionEmitter(
            self.events.append,
            session_id=uuid.uuid5(namespace, f"{prefix}session").hex,
            clock=lambda: clock.now,
            id_factory=new_id,
            host_id="importer",
            image_name=f"imported/{self.framework}",
            extra=extra,
            **envelope,
        )

    def name_next(self, label: str) -> None:
        """Give the next event an id derived from ``label`` instead of its position (a span id, a verdict)."""
        self._clock.fixed_id = uuid.uuid5(self._namespace, label).hex

    @property
    def session_id(self) -> str:
        """The session's id (uuid5 of the record's sha256 and the run's key)."""
        return self.emitter.session_id

    @property
    def now(self) -> int:
        """The time the next event gets (micros)."""
        return self._clock.now

    def at(self, ts_us: int | None) -> None:
        """Set the time of the next events; never moves backwards, so ``seq`` order and time agree."""
        if ts_us is not None:
            self._clock.now = max(self._clock.now, ts_us) if self.events else ts_us

    def advance(self, ts_us: int | None) -> None:
        """Move to a recorded time, or one synthetic tick on when the format has none here."""
        if ts_us is None:
            self.tick()
        else:
            self.at(ts_us)

    def tick(self, seconds: float = 0.0) -> None:
        """Advance the synthetic clock by ``seconds`` plus one tick."""
        self._clock.now += int(min(max(seconds, 0.0), 1e9) * 1_000_000) + SYNTHETIC_TICK_US

    def group(self, group_id: str | None, attempt: int | None) -> None:
        """Put the run in the rollout group its record names (``group_id``, ``attempt``): every event carries it."""
        if group_id is not None or attempt is not None:
            self.emitter.envelope.update(group_id=group_id, attempt=attempt)

    def start(
        self,
        instruction: str,
        config: Any = None,
        *,
        workspace_root: str | None = None,
        task_family: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> str:
        """``session_start``; limits are unknown for recorded runs and left at zero.

        Args:
            instruction: the task statement (whole: a long one travels in parts).
            config: the framework's run configuration (its digest is recorded).
            workspace_root: the framework's working directory (``/testbed``, ``/workspace``, …): the
                agent's own workspace, where its writes are not "outside the workspace".
            task_family: what novelty compares within (the benchmark instance).
            extra: more facts of the run for ``session_start``'s ``extra`` (``prompt_source``).
        """
        start_extra = dict(extra or {})
        # where the session came from (``trajectories.origin``): the OTLP receiver's conversations
        # (their source is the receiver, not a file) are ``otlp``, an imported file ``import:<format>``
        start_extra.setdefault("origin", "otlp" if self.source.path == OTLP_SOURCE else f"import:{self.framework}")
        if workspace_root:
            start_extra["workspace_root"] = workspace_root
        if task_family:
            start_extra["task_family"] = task_family
        payload: typed.SessionStart = {
            "cpu_limit": 0.0,
            "memory_limit_bytes": 0,
            "pids_limit": 0,
            "timeout_s": 0.0,
            "network_enabled": False,
            "egress_allowlist": [],
            "config_digest": digest(config) if config is not None else self.source.sha256,
            "instruction": instruction,
        }
        return self.emitter.emit("session_start", payload, "system", extra=start_extra or None)

    def model_call(
        self,
        reply: Mapping[str, Any],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        model: str = "",
        sampling: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        finish_reason: str | None = None,
        response_id: str | None = None,
        prompt_token_ids: list[int] | None = None,
        completion_token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        cost_usd: float | None = None,
    ) -> typed.ModelCall:
        """The ``model_call`` (schema v3) of one recorded turn: the conversation so far as the request, ``reply``.

        The run's own messages are what the model saw, so they are kept as they are (content
        addressed, a delta per call) for the exporters; token ids only when the run recorded them.
        """
        return self.calls.record(
            reply,
            tools=tools,
            model=model,
            sampling=sampling or {},
            usage=usage or {},
            finish_reason=finish_reason,
            response_id=response_id,
            prompt_token_ids=prompt_token_ids,
            completion_token_ids=completion_token_ids,
            logprobs=logprobs,
            cost_usd=cost_usd,
        )

    def agent_input(
        self,
        *,
        prompt_digest: str,
        input_tokens: int = 0,
        cached_tokens: int = 0,
        n_messages: int = 0,
        content: str | None = None,
        model_call: typed.ModelCall | None = None,
        message_id: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> str:
        """``agent_input``: what the model was given for one turn.

        Args:
            extra: what the server said about this call (``policy_version``: the weights' version,
                ``engine``, ``dtype``, ``system_fingerprint``), as the fleet's LLM agent records it.
        """
        payload: typed.AgentInput = {
            "prompt_digest": prompt_digest,
            "input_tokens": input_tokens,
            "cached_tokens": cached_tokens,
            "n_messages": n_messages,
            "content": content,
            "model_call": model_call,
        }
        return self.emitter.emit(
            "agent_input", payload, "agent", agent_message_id=message_id, extra=dict(extra) if extra else None
        )

    def action(
        self,
        tool_name: str,
        arguments: str,
        command: str | None,
        thought: str | None,
        *,
        tool_call_id: str,
        message_id: str | None = None,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
        cost_usd: float = 0.0,
        model_latency_ms: float = 0.0,
        finish_reason: str | None = None,
    ) -> str:
        """``agent_action``: one tool call, arguments and thought whole."""
        payload: typed.AgentAction = {
            "tool_name": tool_name or "unknown",
            "tool_call_id": tool_call_id,
            "arguments": arguments,
            "command": command,
            "thought": thought or None,
            "output_tokens": output_tokens,
            "reasoning_tokens": reasoning_tokens,
            "cost_usd": cost_usd,
            "model_latency_ms": max(model_latency_ms, 0.0),
            "finish_reason": finish_reason,
        }
        return self.emitter.emit("agent_action", payload, "agent", agent_message_id=message_id)

    def feedback(
        self,
        action_event_id: str,
        output: str,
        *,
        tool_call_id: str = "",
        exit_code: int | None = None,
        duration_ms: float = 0.0,
        elided: bool = False,
        full_bytes: int | None = None,
        failure_reason: str | None = None,
    ) -> str:
        """``env_feedback`` answering an action, the output whole (a large one travels in parts).

        Args:
            elided: the format itself already elided part of the output (what the agent saw was cut).
            full_bytes: size of the complete output when the format records it (else the text's size).
        """
        size = utf8_len(output, "surrogatepass")
        payload: typed.EnvFeedback = {
            "tool_call_id": tool_call_id or "",
            "output": output,
            "exit_code": exit_code if exit_code is None or -(2**31) <= exit_code < 2**31 else None,
            "duration_ms": max(float(duration_ms), 0.0),
            "truncated": elided,
            "output_bytes": max(full_bytes or 0, size),
            "failure_reason": failure_reason,
            "output_ref": None,
        }
        return self.emitter.emit("env_feedback", payload, "environment", parent_event_id=action_event_id)

    def file_op(self, op: str, path: str, size_bytes: int = 0, sha256: str | None = None) -> str:
        """``file_op`` the run's own records show (an edit tool's write)."""
        payload: typed.FileOp = {"op": op, "path": path, "size_bytes": size_bytes, "sha256": sha256}
        return self.emitter.emit("file_op", payload, "environment")

    def end(
        self,
        status: str,
        runtime_s: float,
        exit_reason: str | None,
        *,
        reward: float | None = None,
        submission_event: str | None = None,
        submission: str | None = None,
    ) -> str:
        """``session_end``; the reward stays None unless the run itself recorded one (a verdict is an evaluation)."""
        payload: typed.SessionEnd = {
            "status": status,
            "runtime_s": max(runtime_s, 0.0),
            "reward": reward,
            "exit_reason": exit_reason[:1000] if exit_reason else None,
        }
        extra = {"submission_event_id": submission_event} if submission_event else {}
        if submission:  # the final patch, when no event of the run holds it
            extra["submission"] = submission
        return self.emitter.emit("session_end", payload, "system", extra=extra or None)

    def verdict(self, verdict: Verdict) -> str:
        """An ``evaluation`` that came with or after the run (a report beside it, the run's own record).

        Its event id derives from the verdict's content, not its position, so importing the run
        again once a report exists adds exactly this event: every earlier event keeps its id and
        payload, and a changed report is a new evaluation, not a clash.
        """
        self.tick()
        key = [verdict.instance_id, verdict.passed, verdict.reward, verdict.provenance, verdict.details]
        self._clock.fixed_id = uuid.uuid5(self._namespace, f"evaluation/{digest(key)}").hex
        payload: typed.Evaluation = {
            "passed": verdict.passed,
            "tests_total": verdict.tests_total,
            "tests_passed": verdict.tests_passed,
            "reward": verdict.reward,
            "fresh_sandbox": False,
            "evaluator": verdict.evaluator,
            "duration_ms": 0.0,
            "details": verdict.details,
            "provenance": verdict.provenance,
        }
        return self.emitter.emit("evaluation", payload, "evaluator")

    def finish(self, position: str = "") -> ImportedSession:
        """The session, safe to send whole: fields within range, secrets redacted, large texts in parts.

        The fields that had to be set aside are listed in ``session_end``'s ``extra['set_aside']``.
        """
        conformed = [conform_event(event, self.issues) for event in self.events]
        self.events.clear()  # from here each event is held once: its texts go as soon as their parts are made
        if self.issues:
            for event in reversed(conformed):
                if event["event_type"] == "session_end":
                    event["extra"] = {**event.get("extra", {}), "set_aside": self.issues.summary()}
                    break
        redact = REDACT.get()
        # the session-level pass: a secret split across two events of the run is caught as in the fleet
        redacted = list(redact_session(_drained(conformed)) if redact else _drained(conformed))
        events = split_session_consuming(redacted)
        return ImportedSession(self.session_id, self.framework, events, self.issues, position or self.source.position)


def _drained(events: list[Event]) -> Iterator[Event]:
    """The events of ``events`` in order, each removed from the list as it is handed on."""
    events.reverse()
    while events:
        yield events.pop()
