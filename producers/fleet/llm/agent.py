"""The LLM agent: an OpenAI-compatible loop with the session's tools, in chat or token-in/token-out mode.

The loop runs on the host (the sandbox never reaches the model endpoint): send the
conversation and the tool definitions, record the call, run each tool call the model made
through :class:`~producers.fleet.agent_api.AgentSession` (recorded like every policy's calls),
append the tool results, repeat until the model answers without a tool call, calls
``submit``, or a cap is reached. Every model call counts against ``max_model_calls`` and every
tool call against ``max_steps``, a malformed one (arguments that are not a JSON object) or one
naming an unknown tool included: they are answered with an error and count all the same.

``token_mode='chat'`` sends messages to the chat endpoint (the server's template renders them);
``token_mode='tito'`` keeps the conversation as one token sequence and sends each turn as ids
(``producers.fleet.llm.tito``), so the recorded ids are one exact sequence whatever the template
does to history.

Each try of each call is one ``agent_input`` event whose ``model_call`` (schema v3) holds the
request as a content-addressed delta, the sampling parameters, the finish reason, usage with
cached prompt tokens, latency, and the token ids and logprobs the server returned (see
``producers.fleet.llm.record``). The ``agent_action`` events of its tool calls share its
``agent_message_id``; the first carries the call's output tokens, cost and latency.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from common.prices import PriceTable
from producers.errors import AgentToolError, ModelAPIError, TokenModeError
from producers.fleet.agent_api import AgentSession
from producers.fleet.agent_caps import CapReached
from producers.fleet.llm.client import ChatClient, Try
from producers.fleet.llm.record import (
    CallRecorder,
    ContentStore,
    canonical,
    parse_response,
    request_message,
    served_by,
    server_cost,
)
from producers.fleet.llm.tito import (
    ENGINES,
    LocalRenderer,
    Renderer,
    ServerRenderer,
    TokenConversation,
    chat_response,
    engine_name,
    generate_request,
    parse_generation,
    parse_hermes,
)

POLICY_VERSION = "llm-agent-1"

SYSTEM_PROMPT = (
    "You are a software engineering agent working in a sandboxed repository (the current directory is the "
    "workspace). Use the tools to inspect files, run commands and tests, and edit files. Paths are relative to the "
    "workspace. When the task is done, call submit."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the workspace; returns the exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout": {"type": "number", "description": "Seconds before it is killed."},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a workspace file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or replace a workspace file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: the workspace is handed to the evaluator.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


@dataclass
class LLMConfig:
    """How the LLM agent reaches and samples its model.

    Args:
        endpoint: OpenAI-compatible base URL (``http://host:8000/v1``).
        model: the model name sent in each request.
        api_key_env: environment variable holding the API key (read on the host; ``None``: no key).
        temperature: sampling temperature.
        max_tokens: completion tokens per call.
        request_logprobs: ask for per-token logprobs and token ids (vLLM/SGLang extensions;
            other servers ignore unknown fields or refuse them: turn it off there).
        timeout_s: per-request timeout.
        max_retries: retries of a transient model-API failure (429, 5xx, timeout).
        backoff_s: first retry wait (doubling).
        prices: the price table the ``max_cost_usd`` cap estimates with (None: ``TRAJLAKE_PRICE_TABLE``);
            a call records only the cost the server reported, the lakehouse prices the rest when read.
        extra_body: more request fields (``top_p``, ``seed``, ``stop`` …), recorded with the sampling parameters.
        token_mode: ``chat`` (messages to the chat endpoint) or ``tito`` (token in, token out).
        engine: the server kind: ``auto`` (chat mode reads whichever ids a response carries), ``vllm``,
            ``sglang``, ``llama.cpp``; ``tito`` needs one of the last three.
        tokenizer: ``tito``: ``None`` renders with the server's template endpoint (vLLM, llama.cpp), a
            path renders with the model's own tokenizer (``transformers``; SGLang needs it).
        renderer: ``tito``: a ready renderer (tests, embedding hosts); overrides ``tokenizer``.
    """

    endpoint: str
    model: str
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int = 1024
    request_logprobs: bool = True
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 0.5
    prices: PriceTable | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    token_mode: str = "chat"
    engine: str = "auto"
    tokenizer: str | None = None
    renderer: Renderer | None = None

    def __post_init__(self) -> None:
        self.engine = engine_name(self.engine)
        if self.token_mode not in ("chat", "tito"):
            raise ModelAPIError(f"token mode must be chat or tito, not {self.token_mode!r}")
        if self.engine != "auto" and self.engine not in (*ENGINES, "openai"):
            raise ModelAPIError(f"engine must be auto, {', '.join(ENGINES)} or openai, not {self.engine!r}")
        if self.token_mode == "tito" and self.engine not in ENGINES:
            raise ModelAPIError(f"--token-mode tito needs --engine {' | '.join(ENGINES)} (got {self.engine})")

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters of every request (recorded canonically in each call)."""
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens, **self.extra_body}
        if self.request_logprobs and self.token_mode == "chat":
            params["logprobs"] = True
            if self.engine in ("auto", "vllm"):  # a vLLM extension; llama.cpp puts ids in the logprobs anyway
                params["return_token_ids"] = True
        return params

    def api_key(self) -> str | None:
        """The API key from ``api_key_env`` (never recorded in any event).

        Raises:
            ModelAPIError: ``api_key_env`` names an unset variable.
        """
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ModelAPIError(f"--api-key-env {self.api_key_env}: the variable is not set")
        return value


def _rendering(render: Callable[[], object], failed: Callable[[str, str], None]) -> None:
    """Run a tito rendering step; a failure leaves an event before it ends the session.

    A failed HTTP try of the server's template or tokenize endpoint was recorded as it happened
    (:class:`ServerRenderer`'s ``on_failure``); a template that cannot be used (:class:`TokenModeError`)
    or a local tokenizer's error is recorded here.
    """
    try:
        render()
    except TokenModeError as exc:
        failed("chat template", str(exc))
        raise
    except ModelAPIError:
        raise
    except Exception as exc:
        failed("tokenizer", f"{type(exc).__name__}: {exc}")
        raise


#: ``failure_reason`` of the step of a tool call the agent refused (malformed arguments, an unknown tool).
REFUSED_CALL = "invalid_tool_call"


def cost_of(model: str, usage: Mapping[str, int | None], prices: PriceTable) -> float:
    """USD of one call from its usage at ``model``'s price (0 without one), for the cost cap."""
    return float(
        prices.cost(model, usage.get("prompt_tokens"), usage.get("cached_tokens"), usage.get("completion_tokens"))
    )


@dataclass
class _Tries:
    """What every try of one agent's model calls is recorded with: the conversation so far and fixed settings."""

    recorder: CallRecorder
    messages: list[dict[str, Any]]
    config: LLMConfig
    sampling: dict[str, Any]
    engine: str | None

    def record(
        self,
        *,
        response: Mapping[str, Any] | None,
        latency_ms: float,
        try_index: int,
        http_status: int | None,
        error: str | None = None,
        cost_usd: float | None = None,
    ) -> dict[str, Any]:
        """The ``model_call`` record of one try over the messages as they stand."""
        return self.recorder.record(
            messages=self.messages,
            tools=TOOLS,
            model=self.config.model,
            sampling=self.sampling,
            response=response,
            latency_ms=latency_ms,
            try_index=try_index,
            http_status=http_status,
            error=error,
            cost_usd=cost_usd,
            token_mode=self.config.token_mode,
            engine=self.engine,
        )


class LLMAgent:
    """The agent callable: ``LLMAgent(config, store)(session)``.

    Args:
        config: endpoint, model and sampling.
        store: the host's content store (shared by the fleet's sessions).
    """

    def __init__(self, config: LLMConfig, store: ContentStore | None = None) -> None:
        self.config = config
        self.store = store or ContentStore()
        self.api_key = config.api_key()
        if config.prices is None:
            from common.settings import Settings

            self.prices = Settings().prices
        else:
            self.prices = config.prices

    def __call__(self, session: AgentSession) -> None:
        """Run the loop on one session.

        Raises:
            ModelAPIError: the model API failed past its retries (or with a non-transient error).
            CapReached: a cap of the session was reached.
        """
        client = ChatClient(
            self.config.endpoint,
            self.api_key,
            timeout_s=self.config.timeout_s,
            max_retries=self.config.max_retries,
            backoff_s=self.config.backoff_s,
        )
        try:
            self._loop(session, client)
        finally:
            client.close()

    def _loop(self, session: AgentSession, client: ChatClient) -> None:
        """Model call, then its tool calls, until the agent submits (answers without a tool) or a cap ends it."""
        ctx = session.context
        config = self.config
        tries = _Tries(
            CallRecorder(self.store),
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": session.instruction}],
            config,
            config.sampling(),
            None if config.engine == "auto" else config.engine,
        )

        def render_failed(what: str, error: str, attempt: Try | None = None, index: int = 0) -> None:
            """Record a failed tokenize or chat-template call (tito) as a failed try of the next model call."""
            record = tries.record(
                response=None,
                latency_ms=attempt.latency_ms if attempt is not None else 0.0,
                try_index=index,
                http_status=attempt.status if attempt is not None else None,
                error=f"{what}: {error}",
            )
            self._emit(ctx, record, f"mc_{ctx.session.session_id[:12]}_{tries.recorder.calls}")

        tokens = self._token_conversation(session, client, tries.messages, render_failed)
        while not session.submitted:
            ctx.check_caps()
            ctx.model_calls += 1  # counted before it is made: a call that fails counts too
            message_id = f"mc_{ctx.session.session_id[:12]}_{tries.recorder.calls}"

            def failed(attempt: Try, index: int, message_id: str = message_id) -> None:
                """Record a failed try; past the deadline, stop retrying (the cap ends the session)."""
                record = tries.record(
                    response=None,
                    latency_ms=attempt.latency_ms,
                    try_index=index,
                    http_status=attempt.status,
                    error=attempt.error,
                )
                self._emit(ctx, record, message_id)
                if ctx.caps.remaining_s() == 0.0:
                    raise CapReached("deadline", f"the model call was still failing at the deadline ({attempt.error})")

            attempt, index, response, completion_ids = self._call_model(session, client, tries, tokens, failed)
            assert attempt.body is not None  # only a successful try comes back
            parsed = parse_response(response)
            reported = server_cost(attempt.body, attempt.headers)
            cost = reported if reported is not None else cost_of(config.model, parsed.usage, self.prices)
            record = tries.record(
                response=response,
                latency_ms=attempt.latency_ms,
                try_index=index,
                http_status=attempt.status,
                cost_usd=reported,  # only what the server said: the lakehouse prices the rest when read
            )
            self._emit(ctx, record, message_id, served_by(attempt.body))
            ctx.model_tokens += (parsed.usage.get("prompt_tokens") or 0) + (parsed.usage.get("completion_tokens") or 0)
            ctx.cost_usd += cost
            tries.messages.append(request_message(parsed.message))
            calls = parsed.message.get("tool_calls") or []
            if not calls:  # the model answered without a tool: it is done
                session.submit()
                break
            results = self._run_tools(session, calls, parsed, attempt, reported, message_id)
            tries.messages.extend(results)
            if tokens is not None and not session.submitted:
                step = partial(tokens.add_environment, results, completion_ids, parsed.finish_reason)
                _rendering(step, render_failed)

    def _token_conversation(
        self,
        session: AgentSession,
        client: ChatClient,
        messages: list[dict[str, Any]],
        render_failed: Callable[..., None],
    ) -> TokenConversation | None:
        """In tito mode, the conversation as token ids (rendered locally or by the server); ``None`` in chat mode."""
        config = self.config
        if config.token_mode != "tito":
            return None
        renderer = config.renderer or (
            LocalRenderer(config.tokenizer)
            if config.tokenizer
            else ServerRenderer(
                client,
                config.engine,
                config.model,
                session.context.caps.remaining_s,
                lambda path, attempt, index: render_failed(path, attempt.error or "failed", attempt, index),
            )
        )
        tokens = TokenConversation(renderer, list(messages), TOOLS)
        _rendering(tokens.start, render_failed)
        return tokens

    def _call_model(
        self,
        session: AgentSession,
        client: ChatClient,
        tries: _Tries,
        tokens: TokenConversation | None,
        failed: Callable[[Try, int], None],
    ) -> tuple[Try, int, dict[str, Any], list[int]]:
        """One model call, retried through ``failed``: the successful try, its index, chat response, completion ids.

        Chat mode posts the messages; tito mode posts the token ids and reads the reply back into a chat response.
        """
        config = self.config
        deadline = session.context.caps.remaining_s
        if tokens is None:
            request = {"model": config.model, "messages": tries.messages, "tools": TOOLS, **tries.sampling}
            attempt, index = client.complete(request, on_failure=failed, deadline_s=deadline)
            assert attempt.body is not None  # complete() returns only successful tries
            return attempt, index, attempt.body, []
        prompt = list(tokens.ids)
        path, body = generate_request(config.engine, config.model, prompt, tries.sampling, config.request_logprobs)
        attempt, index = client.post(path, body, on_failure=failed, deadline_s=deadline)
        assert attempt.body is not None
        generation = parse_generation(config.engine, attempt.body)
        reply = parse_hermes(generation.text, f"call_{tries.recorder.calls}")
        response = chat_response(generation, reply, prompt)
        tokens.add_completion(generation.completion_ids)
        return attempt, index, response, generation.completion_ids

    def _run_tools(
        self,
        session: AgentSession,
        calls: list[dict[str, Any]],
        parsed: Any,
        attempt: Try,
        reported: float | None,
        message_id: str,
    ) -> list[dict[str, Any]]:
        """Each tool call of one reply run in turn (until one submits): the tool messages that answer them."""
        results: list[dict[str, Any]] = []
        for position, call in enumerate(calls):
            turn: dict[str, Any] = {"tool_call_id": call["id"], "message_id": message_id}
            if position == 0:  # the call's tokens, cost and latency go with its first action
                turn.update(
                    output_tokens=parsed.usage.get("completion_tokens") or 0,
                    reasoning_tokens=parsed.usage.get("reasoning_tokens") or 0,
                    cost_usd=reported or 0.0,
                    model_latency_ms=round(attempt.latency_ms, 3),
                    finish_reason=parsed.finish_reason,
                    thought=parsed.message.get("content"),
                )
            else:
                turn["output_tokens"] = 0
            result = self._dispatch(session, call, turn)
            results.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            if session.submitted:
                break
        return results

    @staticmethod
    def _emit(ctx: Any, record: dict[str, Any], message_id: str, served: dict[str, str] | None = None) -> str:
        emitted: str = ctx.session.agent_input(
            prompt_digest=record["request_sha256"],
            input_tokens=record["prompt_tokens"] or 0,  # a failed try used none
            cached_tokens=record["cached_tokens"] or 0,
            n_messages=record["n_messages"],
            content=None,
            model_call=record,
            message_id=message_id,
            extra=served or None,  # the weights' version and engine, as the server reported them
        )
        return emitted

    @staticmethod
    def _dispatch(session: AgentSession, call: Mapping[str, Any], turn: dict[str, Any]) -> str:
        """Run one tool call; its result text goes back to the model (errors too, as text)."""
        function = call.get("function") or {}
        name = function.get("name")
        known = {t["function"]["name"] for t in TOOLS}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments are not an object")
        except ValueError as exc:
            answer = f"error: the arguments of {name} are not a JSON object ({exc})"
            return LLMAgent._refused(session, call, turn, answer)
        if name not in known:
            answer = f"error: unknown tool {name!r}; tools: {canonical(sorted(known))}"
            return LLMAgent._refused(session, call, turn, answer)
        try:
            if name == "bash":
                timeout = arguments.get("timeout")
                result = session.run(
                    str(arguments.get("command", "")),
                    timeout=float(timeout) if isinstance(timeout, int | float) else None,
                    turn=turn,
                )
                return f"exit code {result.exit_code}\n{result.output}"
            if name == "read_file":
                return session.read_file(str(arguments.get("path", "")), turn=turn)
            if name == "write_file":
                session.write_file(str(arguments.get("path", "")), str(arguments.get("content", "")), turn=turn)
                return "ok"
            if name == "submit":
                session.submit()
                return "submitted"
        except AgentToolError as exc:
            return f"error: {exc}"
        return f"error: unknown tool {name!r}"  # unreachable: every known tool is handled above

    @staticmethod
    def _refused(session: AgentSession, call: Mapping[str, Any], turn: dict[str, Any], answer: str) -> str:
        """A tool call that runs nothing still is a step: an action as the model wrote it, its error as feedback.

        It counts against ``max_steps``; the feedback has no exit code (nothing ran) and
        ``failure_reason`` :data:`REFUSED_CALL`.

        Raises:
            CapReached: the step cap (or another) is reached.
        """
        ctx = session.context
        ctx.check_caps()
        ctx.steps += 1
        function = call.get("function") or {}
        raw = function.get("arguments")
        action_id = ctx.session.action(
            str(function.get("name") or "") or "(none)",
            arguments=raw if isinstance(raw, str) else canonical(raw if raw is not None else {}),
            **turn,
        )
        ctx.session.feedback(
            action_id,
            output=answer,
            exit_code=None,
            failure_reason=REFUSED_CALL,
            tool_call_id=str(call.get("id") or turn.get("tool_call_id") or ""),
        )
        return answer
