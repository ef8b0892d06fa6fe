"""Token in, token out: a session's conversation kept as one sequence of token ids, each turn sent as ids.

In chat mode the server renders the messages with its chat template on every call, and a template
re-renders history differently from what the model emitted (``<tool_call>{…}</tool_call>`` comes
back as ``<tool_call>\\n{…}\\n</tool_call>``, earlier reasoning is dropped, arguments that are not
an object become ``{}``), so the next prompt no longer extends the previous prompt + completion and
an RL trainer cannot use the ids. Here the host keeps the ids instead:

- the first prompt is the template's rendering of the system prompt, the instruction and the tools;
- each completion's ids are appended exactly as the server sampled them;
- only what the environment adds is tokenized: the template's closing of the assistant turn, the
  tool results and the next generation prompt, found as the difference between the rendering of
  the conversation head + a placeholder assistant turn left open, and the same with the tool
  results after it (:meth:`TokenConversation.add_environment`). The closing's first token is
  dropped when the completion already ends with it (the end-of-turn token the model sampled).

Servers: vLLM (``/v1/completions`` with a token prompt; ``/tokenize`` with ``messages``),
SGLang (``/generate`` with ``input_ids``; it has no template endpoint, so the model's own
tokenizer renders: ``tokenizer=PATH``), llama.cpp (``/completion`` with a token prompt,
``/apply-template`` + ``/tokenize``). Tool calls are parsed from the completion text in the
Hermes format (``<tool_call>{"name": …, "arguments": …}</tool_call>``, ``<think>…</think>`` as
reasoning), which is what the server's own parser would do in chat mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.errors import ModelConfigError, TokenModeError
from producers.fleet.llm.client import ChatClient, Try

#: Server kinds with a token-in/token-out path (``llama.cpp`` also answers to ``llamacpp``).
ENGINES = ("vllm", "sglang", "llama.cpp")
#: The placeholder assistant turn whose closing the environment tokens start with.
_PLACEHOLDER = "ok"

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def engine_name(engine: str) -> str:
    """The canonical name of a server kind (``llamacpp`` → ``llama.cpp``)."""
    return "llama.cpp" if engine in ("llamacpp", "llama-cpp", "llama_cpp") else engine


@dataclass
class Generation:
    """One completion as the server returned it: sampled ids, their logprobs and the decoded text."""

    completion_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    text: str
    finish_reason: str | None
    response_id: str | None = None
    model: str | None = None
    cached_tokens: int | None = None


def generate_request(
    engine: str, model: str, prompt_ids: Sequence[int], sampling: Mapping[str, Any], logprobs: bool
) -> tuple[str, dict[str, Any]]:
    """The path and body of a token-prompt generation on ``engine``.

    Args:
        engine: ``vllm``, ``sglang`` or ``llama.cpp``.
        model: the model name (vLLM checks it; the others ignore it).
        prompt_ids: the whole conversation so far.
        sampling: ``temperature``, ``max_tokens`` and any extra fields (``top_p``, ``seed``, ``stop`` …).
        logprobs: ask for the sampled tokens' logprobs.

    Raises:
        TokenModeError: an engine without a token-prompt path.
    """
    params = {k: v for k, v in sampling.items() if k not in ("logprobs", "return_token_ids", "max_tokens")}
    max_tokens = sampling.get("max_tokens")
    engine = engine_name(engine)
    if engine == "vllm":
        body = {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, **params}
        body.update(return_token_ids=True, skip_special_tokens=False)
        if logprobs:
            body["logprobs"] = 1
        return "/completions", body
    if engine == "sglang":
        sampling_params = {"max_new_tokens": max_tokens, "skip_special_tokens": False, **params}
        return "//generate", {"input_ids": list(prompt_ids), "sampling_params": sampling_params, "return_logprob": True}
    if engine == "llama.cpp":
        body = {"prompt": list(prompt_ids), "n_predict": max_tokens, "return_tokens": True, "cache_prompt": True}
        body.update(params)
        if logprobs:
            body["n_probs"] = 1
        return "//completion", body
    raise TokenModeError(f"token-in/token-out needs a server kind ({', '.join(ENGINES)}), not {engine!r}")


def _finish(value: Any) -> str | None:
    if isinstance(value, Mapping):  # SGLang: {"type": "stop", "matched": 151645}
        value = value.get("type")
    return {"eos": "stop", "word": "stop", "limit": "length"}.get(str(value), str(value)) if value else None


def parse_generation(engine: str, body: Mapping[str, Any]) -> Generation:
    """Read a token-prompt generation's answer: ids, logprobs, text and finish reason.

    Raises:
        TokenModeError: the answer has no completion token ids (an old server, or the option refused).
    """
    engine = engine_name(engine)
    if engine == "vllm":
        choice = (body.get("choices") or [{}])[0]
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        usage = body.get("usage") or {}
        result = Generation(
            completion_ids=[int(i) for i in ids] if ids is not None else [],
            logprobs=[float(x) for x in lp.get("token_logprobs") or []],
            tokens=[str(t) for t in lp.get("tokens") or []],
            text=str(choice.get("text") or ""),
            finish_reason=_finish(choice.get("finish_reason")),
            response_id=body.get("id"),
            model=body.get("model"),
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        )
        missing = ids is None
    elif engine == "sglang":
        meta = body.get("meta_info") or {}
        entries = meta.get("output_token_logprobs") or []
        ids = body.get("output_ids")
        if ids is None and entries:
            ids = [entry[1] for entry in entries]
        result = Generation(
            completion_ids=[int(i) for i in ids or []],
            logprobs=[float(entry[0]) for entry in entries],
            tokens=[str(entry[2]) if len(entry) > 2 and entry[2] is not None else "" for entry in entries],
            text=str(body.get("text") or ""),
            finish_reason=_finish(meta.get("finish_reason")),
            response_id=meta.get("id"),
            cached_tokens=meta.get("cached_tokens"),
        )
        missing = ids is None
    elif engine == "llama.cpp":
        probs = body.get("completion_probabilities") or []
        ids = body.get("tokens")
        if not ids and probs:
            ids = [entry.get("id") for entry in probs]
        result = Generation(
            completion_ids=[int(i) for i in ids or []],
            logprobs=[float(entry.get("logprob", 0.0)) for entry in probs],
            tokens=[str(entry.get("token", "")) for entry in probs],
            text=str(body.get("content") or ""),
            finish_reason=_finish(body.get("stop_type")),
            model=body.get("model"),
            cached_tokens=body.get("tokens_cached"),
        )
        missing = ids is None
    else:
        raise TokenModeError(f"no token-in/token-out answer shape for {engine!r}")
    if missing:
        raise TokenModeError(f"the {engine} server returned no completion token ids: it cannot run token-in/token-out")
    if result.logprobs and len(result.logprobs) != len(result.completion_ids):
        result.logprobs, result.tokens = [], []  # a partial list would mislabel tokens: keep none
    return result


def parse_hermes(text: str, call_prefix: str) -> dict[str, Any]:
    """The assistant message of a completion in the Hermes tool-call format.

    ``<think>…</think>`` at the start is the reasoning; every ``<tool_call>{"name": …, "arguments":
    …}</tool_call>`` is a tool call (ids ``{call_prefix}_{i}``); the text before the first is the
    content. A call whose JSON does not parse keeps its text as the arguments and an empty name, so
    the agent answers it with an error (and counts it) instead of dropping it.
    """
    message: dict[str, Any] = {"role": "assistant", "content": None}
    think = _THINK.match(text)
    if think:
        message["reasoning_content"] = think.group(1).strip()
        text = text[think.end() :]
    first = text.find("<tool_call>")
    content = (text if first < 0 else text[:first]).strip()
    message["content"] = content or None
    calls = []
    for i, match in enumerate(_TOOL_CALL.finditer(text)):
        inner = match.group(1).strip()
        try:
            parsed = json.loads(inner)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
            name, arguments = parsed["name"], json.dumps(parsed.get("arguments", {}), ensure_ascii=False)
        else:
            name, arguments = "", inner
        function = {"name": name, "arguments": arguments}
        calls.append({"id": f"{call_prefix}_{i}", "type": "function", "function": function})
    if calls:
        message["tool_calls"] = calls
    return message


class Renderer(Protocol):
    """Renders messages with the model's chat template into token ids."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]:
        """Token ids of the rendered conversation (no BOS added beyond what the template writes)."""
        ...


@dataclass
class ServerRenderer:
    """The server's own template and tokenizer: vLLM's ``/tokenize`` with ``messages``; llama.cpp's
    ``/apply-template`` then ``/tokenize`` (which leaves a final assistant message open by default).

    Args:
        client: the session's HTTP client.
        engine: ``vllm`` or ``llama.cpp``.
        model: sent with vLLM's request.
        deadline_s: seconds left in the session.
        on_failure: called with the endpoint, each failed try and its index (the session records it).
    """

    client: ChatClient
    engine: str
    model: str
    deadline_s: Callable[[], float | None] | None = None
    on_failure: Callable[[str, Try, int], None] | None = None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        hook = self.on_failure
        failed = None if hook is None else (lambda attempt, index: hook(path.lstrip("/"), attempt, index))
        try:
            attempt, _ = self.client.post(path, body, failed, deadline_s=self.deadline_s)
        except ModelConfigError as exc:
            needs = f"token-in/token-out needs the server's {path.lstrip('/')} endpoint"
            raise ModelConfigError(f"{exc} ({needs})") from exc
        assert attempt.body is not None
        return attempt.body

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]:
        """Token ids of the rendered conversation.

        Raises:
            TokenModeError: a server kind without a template endpoint (SGLang: give a tokenizer path).
        """
        engine = engine_name(self.engine)
        if engine == "vllm":
            body: dict[str, Any] = {
                "model": self.model,
                "messages": list(messages),
                "add_generation_prompt": add_generation_prompt,
                "continue_final_message": continue_final_message,
                "add_special_tokens": False,
            }
            if tools:
                body["tools"] = list(tools)
            return [int(t) for t in self._post("//tokenize", body)["tokens"]]
        if engine == "llama.cpp":
            body = {"messages": list(messages)}
            if tools:
                body["tools"] = list(tools)
            text = str(self._post("//apply-template", body)["prompt"])
            tokens = self._post("//tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
            return [int(t["id"]) if isinstance(t, Mapping) else int(t) for t in tokens]
        raise TokenModeError(
            f"a {engine} server has no chat-template endpoint: give the model's tokenizer (--tokenizer PATH)"
        )


@dataclass
class LocalRenderer:
    """The model's own tokenizer and chat template, loaded with ``transformers`` from a local path.

    Raises:
        TokenModeError: ``transformers`` is not installed, or the path holds no tokenizer.
    """

    path: str
    _tokenizer: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            from transformers import AutoTokenizer  # optional: only this renderer needs it
        except ImportError as exc:
            raise TokenModeError("--tokenizer PATH needs the transformers package on the host") from exc
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        except (OSError, ValueError) as exc:
            raise TokenModeError(f"--tokenizer {self.path}: {exc}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]:
        """Token ids of the rendered conversation."""
        out = self._tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=True,
        )
        ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
        return [int(i) for i in ids]


@dataclass
class TokenConversation:
    """One session's token sequence: the first prompt, then completions and environment tokens appended.

    Args:
        renderer: the chat template.
        head: the system prompt and the instruction.
        tools: the tool definitions the template renders into the prompt.
    """

    renderer: Renderer
    head: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    ids: list[int] = field(default_factory=list)
    _open: list[int] | None = None

    def start(self) -> list[int]:
        """Render the first prompt (the head with the generation prompt)."""
        self.ids = self.renderer.render(self.head, self.tools, add_generation_prompt=True, continue_final_message=False)
        return list(self.ids)

    def add_completion(self, completion_ids: Sequence[int]) -> None:
        """Append what the model sampled, exactly."""
        self.ids.extend(completion_ids)

    def add_environment(
        self, results: Sequence[Mapping[str, Any]], completion_ids: Sequence[int], finish_reason: str | None
    ) -> list[int]:
        """Append the environment's tokens after a completion: turn closing, tool results, generation prompt.

        Args:
            results: the tool messages of this turn.
            completion_ids: the completion they answer (its last id may be the template's end of turn).
            finish_reason: ``stop`` (or ``tool_calls``) when the model ended its turn itself.

        Returns:
            The ids appended.

        Raises:
            TokenModeError: the template does not render tool results as a suffix of an open assistant turn.
        """
        placeholder = {"role": "assistant", "content": _PLACEHOLDER}
        if self._open is None:
            self._open = self.renderer.render(
                [*self.head, placeholder], self.tools, add_generation_prompt=False, continue_final_message=True
            )
        full = self.renderer.render(
            [*self.head, placeholder, *results], self.tools, add_generation_prompt=True, continue_final_message=False
        )
        if full[: len(self._open)] != self._open:
            raise TokenModeError(
                "the chat template does not render tool results after an open assistant turn as a suffix; "
                "token-in/token-out cannot keep one sequence with it (use --token-mode chat)"
            )
        added = full[len(self._open) :]
        ended = finish_reason in ("stop", "tool_calls")
        if ended and completion_ids and added and completion_ids[-1] == added[0]:
            added = added[1:]  # the model sampled the end-of-turn token itself
        self.ids.extend(added)
        return added


def chat_response(generation: Generation, message: dict[str, Any], prompt_ids: Sequence[int]) -> dict[str, Any]:
    """A generation in the chat-completions shape the recorder reads (prompt ids as sent, ids as sampled)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if message.get("tool_calls") and generation.finish_reason == "stop" else None,
        "token_ids": generation.completion_ids,
    }
    choice["finish_reason"] = choice["finish_reason"] or generation.finish_reason
    if generation.logprobs:
        n = len(generation.logprobs)
        texts = generation.tokens if len(generation.tokens) == n else [""] * n
        choice["logprobs"] = {
            "content": [{"token": t, "logprob": lp} for t, lp in zip(texts, generation.logprobs, strict=True)]
        }
    return {
        "id": generation.response_id,
        "model": generation.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(generation.completion_ids),
            "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
        },
        "prompt_token_ids": list(prompt_ids),
    }
