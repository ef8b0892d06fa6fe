"""A test double at the network boundary: an OpenAI-compatible server on loopback, in the shapes of vLLM,
SGLang and llama.cpp.

No model runs here. :class:`FakeOpenAIServer` is a real HTTP/1.1 server (``http.server`` in a
thread, keep-alive) whose "model" is a *script*: a function of the conversation's messages
returning the next assistant turn (text and/or tool calls). What makes it a faithful double is
that the turn goes through the same text path a real server's does:

- the turn is *emitted* as text in the Hermes format (``<think>…</think>`` when ``reasoning``,
  the content, then ``<tool_call>{"name": …, "arguments": …}</tool_call>`` without newlines) and
  ended with ``<|im_end|>``; its tokens are the completion;
- prompts are a ChatML template's rendering of the messages (tools in the system turn, tool
  results as ``<tool_response>`` blocks in a user turn), tokenized by a toy tokenizer: special
  tokens, whitespace runs and words, each piece an id from a vocabulary grown as pieces are seen
  (exact round trip: ``decode(encode(text)) == text``);
- with ``drift=True`` the template re-renders history the way real ones do: tool calls as
  ``<tool_call>\\n{…}\\n</tool_call>``, arguments that are not an object as ``{}``, earlier
  reasoning dropped; so a chat-mode prompt stops extending the previous prompt + completion
  exactly as it does against vLLM. With ``drift=False`` (default) the re-rendering equals the
  emission and the ids extend.

Endpoints by ``engine``: every engine answers ``POST /v1/chat/completions`` (vLLM: ``token_ids``,
``prompt_token_ids``, ``token_id:N`` tokens on request; llama.cpp: ``logprobs.content[].id`` and
``timings``; SGLang: logprobs without ids). Token prompts: vLLM ``/v1/completions`` and
``/tokenize`` (``messages`` or ``prompt``); SGLang ``/generate`` (``input_ids``); llama.cpp
``/completion``, ``/apply-template`` (a final assistant message left open) and ``/tokenize``.
A token prompt is decoded and parsed back into messages for the script. ``fail_next`` queues HTTP
errors (429, 500 …) to answer before the next successful responses; ``models`` makes other model
names a 404 as vLLM answers them. Every successful generation's raw body is kept in
``responses`` so tests can compare what landed with what the server sent.

Used by the tests, by ``trajlake bench agents`` and by ``trajlake fleet test-model`` (which serves the
scripted solver for trying ``--agent llm`` by hand); never by the fleet itself.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from producers.fleet.llm.record import canonical
from producers.fleet.llm.tito import parse_hermes
from producers.fleet.tasks import TaskInstance

SPECIALS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
IM_END = 2  # the end-of-turn (EOS) token: SPECIALS[1]
_PIECES = re.compile("|".join(re.escape(s) for s in SPECIALS) + r"|\s+|[^\s<]+|<")


@dataclass
class Turn:
    """One scripted assistant turn: text and tool calls (name, arguments), or ``raw`` emitted text."""

    content: str | None = None
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)
    raw: str | None = None


Script = Callable[[list[dict[str, Any]]], Turn]


class ToyTokenizer:
    """Special tokens, whitespace runs and words; ids from a vocabulary grown as pieces are seen (thread-safe).

    Args:
        byte_fallback: a piece with a non-ASCII character is one token per UTF-8 byte (as byte-level
            BPE vocabularies spell rare characters), so tokens end inside multi-byte characters.
    """

    def __init__(self, byte_fallback: bool = False) -> None:
        self.byte_fallback = byte_fallback
        self._ids: dict[str, int] = {s: i + 1 for i, s in enumerate(SPECIALS)}
        self._pieces: dict[int, str] = {i: s for s, i in self._ids.items()}
        self._byte_ids: dict[int, int] = {}  # byte value -> id
        self._bytes: dict[int, bytes] = {}  # id -> its one byte
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (every character belongs to exactly one piece, or its bytes to byte tokens)."""
        out = []
        with self._lock:
            for piece in _PIECES.findall(text):
                if self.byte_fallback and not piece.isascii():
                    for value in piece.encode():
                        token = self._byte_ids.get(value)
                        if token is None:
                            token = self._byte_ids[value] = 100 + len(self._ids) + len(self._byte_ids)
                            self._bytes[token] = bytes([value])
                        out.append(token)
                    continue
                token = self._ids.get(piece)
                if token is None:
                    token = self._ids[piece] = 100 + len(self._ids) + len(self._byte_ids)
                    self._pieces[token] = piece
                out.append(token)
        return out

    def piece_bytes(self, token: int) -> bytes:
        """The bytes of one id (unknown: none)."""
        one = self._bytes.get(token)
        return one if one is not None else self._pieces.get(token, "").encode()

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (unknown ids decode to nothing)."""
        return b"".join(self.piece_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def piece(self, token: int) -> str:
        """The text of one id (a byte token inside a character: U+FFFD)."""
        return self.piece_bytes(token).decode("utf-8", errors="replace")


def _tool_call_text(name: str, arguments: str, drift: bool) -> str:
    if not drift:  # the emission's own form
        return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'
    try:
        value = json.loads(arguments)
    except ValueError:
        value = {}
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": value if isinstance(value, dict) else {}})
        + ("\n</tool_call>")
    )


def render(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    drift: bool = False,
    strip_reasoning: bool = False,
) -> str:
    """The ChatML rendering of a conversation (Hermes tool calls; see the module docstring).

    ``strip_reasoning``: earlier turns' reasoning is left out, whatever the client sends back (as the
    DeepSeek-R1/V3.x reasoner, Qwen3 thinking and gpt-oss templates do).
    """
    out: list[str] = []
    rest = list(messages)
    system = rest.pop(0)["content"] if rest and rest[0].get("role") == "system" else None
    if system is not None or tools:
        text = str(system or "")
        if tools:
            text += "\n\n# Tools\n<tools>\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools) + "\n</tools>"
        out.append(f"<|im_start|>system\n{text}<|im_end|>\n")
    for i, message in enumerate(rest):
        role = message.get("role")
        last = i == len(rest) - 1
        if role == "tool":
            opening = i == 0 or rest[i - 1].get("role") != "tool"
            closing = last or rest[i + 1].get("role") != "tool"
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            out.append(("<|im_start|>user\n" if opening else "\n") + block + ("<|im_end|>\n" if closing else ""))
            continue
        if role == "assistant":
            body = ""
            if message.get("reasoning_content") and not (drift or strip_reasoning):
                body += f"<think>{message['reasoning_content']}</think>"
            body += message.get("content") or ""
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                body += _tool_call_text(str(function.get("name") or ""), str(function.get("arguments") or "{}"), drift)
            if last and continue_final_message:
                out.append(f"<|im_start|>assistant\n{body}")
                continue
            out.append(f"<|im_start|>assistant\n{body}<|im_end|>\n")
            continue
        out.append(f"<|im_start|>{role}\n{message.get('content') or ''}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def parse_chatml(text: str) -> list[dict[str, Any]]:
    """Messages of a rendered prompt (for the script: roles and contents; tool results as ``tool``)."""
    messages = []
    for block in text.split("<|im_start|>")[1:]:
        role, _, body = block.partition("\n")
        body = body.split("<|im_end|>")[0]
        if role == "user" and body.startswith("<tool_response>"):
            for result in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", body, re.S):
                messages.append({"role": "tool", "content": result})
            continue
        if role == "assistant" and not body:
            continue  # the generation prompt
        messages.append({"role": role, "content": body})
    return messages


def emission(turn: Turn, reasoning: str | None = None) -> str:
    """What the model writes for a turn: reasoning, content, compact Hermes tool calls (no end token)."""
    if turn.raw is not None:
        return turn.raw
    text = f"<think>{reasoning}</think>" if reasoning else ""
    text += turn.content or ""
    for name, args in turn.tool_calls:
        text += "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
    return text


def _turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def _instruction(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")


def solver_script(tasks: Iterable[TaskInstance]) -> Script:
    """The scripted solver's decisions as model turns: look, test, write the solution, test, submit.

    Args:
        tasks: the task instances the fleet will run (matched by their instruction).
    """
    by_instruction = {task.instruction: task for task in tasks}

    def script(messages: list[dict[str, Any]]) -> Turn:
        task = by_instruction.get(_instruction(messages))
        if task is None:
            return Turn("I do not know this task.")
        plan: list[Turn] = [
            Turn("Look at the workspace.", [("bash", {"command": "ls -la"})]),
            Turn(None, [("read_file", {"path": task.deliverables[0]})]),
            Turn("Run the tests to see what fails.", [("bash", {"command": "python3 run_tests.py"})]),
            Turn(
                "Write the fix.",
                [("write_file", {"path": path, "content": text}) for path, text in sorted(task.solution.items())],
            ),
            Turn("Check the fix.", [("bash", {"command": "python3 run_tests.py"})]),
            Turn("Done.", [("submit", {})]),
        ]
        index = _turns(messages)
        return plan[index] if index < len(plan) else Turn("Done.")

    return script


def loop_script(turns: int | None = None, command: str = "echo step") -> Script:
    """``turns`` bash calls (``None``: forever), then a final answer without tools."""

    def script(messages: list[dict[str, Any]]) -> Turn:
        index = _turns(messages)
        if turns is not None and index >= turns:
            return Turn("Finished.", [("submit", {})])
        return Turn(f"Step {index}.", [("bash", {"command": f"{command} {index}"})])

    return script


def malformed_script() -> Script:
    """A model that never makes a valid tool call: non-object arguments, unknown tools, unparsable JSON, forever."""
    bad = [
        Turn("Listing.", [("bash", ["ls", "-la"])]),
        Turn(None, [("frobnicate", {"x": 1})]),
        Turn(raw='Trying.<tool_call>{"name": "bash", "arguments": {"command": </tool_call>'),
        Turn("Again.", [("read_file", "notes.txt")]),
    ]
    return lambda messages: bad[_turns(messages) % len(bad)]


class FakeOpenAIServer:
    """The scripted OpenAI-compatible server (start with ``with FakeOpenAIServer(script) as server``).

    Args:
        script: the next turn for a conversation.
        delay_s: the server's own latency per successful response.
        seed: logprob values.
        model: reported as ``model``.
        engine: ``vllm``, ``sglang`` or ``llama.cpp``: the response shapes and endpoints.
        drift: re-render history as real templates do (breaks chat-mode id extension).
        reasoning: emit ``<think>…</think>`` reasoning before each turn (a callable: the reasoning of
            the n-th assistant turn, None for a turn without).
        strip_reasoning: the template leaves earlier turns' reasoning out of the next prompt.
        models: model names served; another name is a 404 (``None``: any name).
        port: the loopback port to listen on (0: a free one).
        byte_fallback: the tokenizer spells non-ASCII pieces byte by byte; llama.cpp's chat
            ``logprobs`` then has one entry per completed character, as llama.cpp's server sends it
            (the tokens ending inside a character get none: their ids are not in the reply).

    Raises:
        OSError: the port is taken.
    """

    def __init__(
        self,
        script: Script,
        delay_s: float = 0.0,
        seed: int = 0,
        model: str = "fake-vllm",
        *,
        engine: str = "vllm",
        drift: bool = False,
        reasoning: bool | Callable[[int], str | None] = False,
        strip_reasoning: bool = False,
        models: Iterable[str] | None = None,
        port: int = 0,
        byte_fallback: bool = False,
    ) -> None:
        self.script = script
        self.delay_s = delay_s
        self.model = model
        self.engine = "llama.cpp" if engine in ("llamacpp", "llama.cpp") else engine
        self.drift = drift
        self.reasoning = reasoning
        self.strip_reasoning = strip_reasoning
        self.models = set(models) if models is not None else None
        self.tokenizer = ToyTokenizer(byte_fallback)
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.responses: list[bytes] = []
        self.statuses: list[int] = []
        self.server_ms: list[float] = []
        self.fail_next: list[int] = []
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._last_prompt: dict[str, list[int]] = {}  # conversation → last prompt + completion (a prefix cache)
        self._counter = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # headers and body go out in two writes: without NODELAY, Nagle + delayed ACK add ~40 ms
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # clients list the models first (GET /v1/models); nothing else is a GET
                found = self.path.split("?")[0].rstrip("/") == "/v1/models"
                status, body = (200, outer._models_list()) if found else (404, b'{"error": {"message": "not found"}}')
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                started = time.perf_counter()
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                status, body, headers = outer._answer(self.path, request)
                elapsed = (time.perf_counter() - started) * 1000
                with outer._lock:  # before the reply: a client reading it finds its server time
                    outer.server_ms.append(elapsed)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Server-Time-Ms", f"{elapsed:.3f}")
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)

    @property
    def url(self) -> str:
        """The base URL to pass as ``--model-endpoint``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the model ---------------------------------------------------------------------------

    def render_ids(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> list[int]:
        """The server's template and tokenizer (what ``/tokenize`` answers; usable as a renderer)."""
        text = render(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            drift=self.drift,
            strip_reasoning=self.strip_reasoning,
        )
        return self.tokenizer.encode(text)

    def _generate(self, messages: list[dict[str, Any]], prompt_ids: list[int]) -> dict[str, Any]:
        """Run the script and sample: completion ids (ending with the end-of-turn token), logprobs, text."""
        turn = self.script(messages)
        with self._lock:
            self._counter += 1
            counter = self._counter
        n = _turns(messages)
        thought = self.reasoning(n) if callable(self.reasoning) else f"Turn {n}: what next?" if self.reasoning else None
        text = emission(turn, thought)
        completion = [*self.tokenizer.encode(text), IM_END]
        conversation = canonical([m.get("content") for m in messages[:2]])
        with self._lock:
            previous = self._last_prompt.get(conversation, [])
            cached = 0
            while cached < min(len(previous), len(prompt_ids)) and previous[cached] == prompt_ids[cached]:
                cached += 1
            self._last_prompt[conversation] = prompt_ids + completion
            logprobs = [-round(self._rng.random() * 3, 6) for _ in completion]
        if self.delay_s:
            time.sleep(self.delay_s)
        return {"counter": counter, "text": text, "ids": completion, "logprobs": logprobs, "cached": cached}

    # -- endpoints ---------------------------------------------------------------------------

    def _models_list(self) -> bytes:
        """``GET /v1/models``: the served names (``models``, else ``model``) as OpenAI lists them."""
        names = sorted(self.models) if self.models is not None else [self.model]
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "trajlake-test"} for name in names]
        return json.dumps({"object": "list", "data": data}).encode()

    def _answer(self, path: str, request: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            self.requests.append(request)
            self.paths.append(path)
            failure = self.fail_next.pop(0) if self.fail_next else None
        routes = {
            "vllm": {
                "/v1/chat/completions": self._chat,
                "/v1/completions": self._vllm_completions,
                "/tokenize": self._vllm_tokenize,
            },
            "sglang": {"/v1/chat/completions": self._chat, "/generate": self._sglang_generate},
            "llama.cpp": {
                "/v1/chat/completions": self._chat,
                "/completion": self._llamacpp_completion,
                "/apply-template": self._llamacpp_apply_template,
                "/tokenize": self._llamacpp_tokenize,
            },
        }[self.engine]
        handler = routes.get(path.rstrip("/"))
        if handler is None:
            return 404, b'{"error": {"message": "not found"}}', {}
        if failure is not None:
            with self._lock:
                self.statuses.append(failure)
            body = json.dumps({"error": {"message": f"injected {failure}", "code": failure}}).encode()
            return failure, body, {"Retry-After": "0"} if failure == 429 else {}
        model = request.get("model")
        if self.models is not None and model is not None and model not in self.models:
            message = {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
            return 404, json.dumps(message).encode(), {}
        answer = handler(request)
        body = json.dumps(answer).encode()
        if path.rstrip("/") not in ("/tokenize", "/apply-template"):
            with self._lock:
                self.responses.append(body)
                self.statuses.append(200)
        return 200, body, {}

    def _entries(self, ids: list[int], logprobs: list[float], as_ids: bool) -> list[dict[str, Any]]:
        entries = []
        pending = b""  # llama.cpp: the bytes of tokens that ended inside a character, sent with the next
        for token, lp in zip(ids, logprobs, strict=True):
            data = self.tokenizer.piece_bytes(token)
            if self.engine == "llama.cpp":
                pending += data
                try:
                    piece = pending.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # an incomplete character: llama.cpp sends no entry for this token
                data, pending = pending, b""
            else:
                piece = data.decode("utf-8", errors="replace")
            entry: dict[str, Any] = {"token": f"token_id:{token}" if as_ids else piece, "logprob": lp}
            entry.update(bytes=list(data), top_logprobs=[])
            if self.engine == "llama.cpp":
                entry = {"id": token, **entry}
            entries.append(entry)
        return entries

    def _chat(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = list(request.get("messages") or [])
        prompt_ids = self.render_ids(
            messages, request.get("tools"), add_generation_prompt=True, continue_final_message=False
        )
        out = self._generate(messages, prompt_ids)
        message = parse_hermes(out["text"], f"call_{out['counter']}")
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        }
        if request.get("logprobs"):
            as_ids = bool(request.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {"content": self._entries(out["ids"], out["logprobs"], as_ids)}
        response: dict[str, Any] = {
            "id": f"chatcmpl-{out['counter']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out["ids"]),
                "total_tokens": len(prompt_ids) + len(out["ids"]),
                "prompt_tokens_details": {"cached_tokens": out["cached"]},
            },
        }
        if self.engine == "vllm" and request.get("return_token_ids"):
            choice["token_ids"] = out["ids"]
            response["prompt_token_ids"] = prompt_ids
        if self.engine == "llama.cpp":
            response["timings"] = {"prompt_n": len(prompt_ids), "predicted_n": len(out["ids"])}
        self.describe(response)
        return response

    def describe(self, response: dict[str, Any]) -> None:
        """Add what the server says about itself to a chat response (nothing here; see ``testing_reasoning``)."""

    def _from_ids(self, prompt_ids: list[int]) -> dict[str, Any]:
        return self._generate(parse_chatml(self.tokenizer.decode(prompt_ids)), prompt_ids)

    def _vllm_completions(self, request: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = [int(t) for t in request["prompt"]]
        out = self._from_ids(prompt_ids)
        choice: dict[str, Any] = {"index": 0, "text": out["text"], "finish_reason": "stop", "stop_reason": None}
        if request.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": [self.tokenizer.piece(t) for t in out["ids"]],
                "token_logprobs": out["logprobs"],
                "top_logprobs": [
                    {self.tokenizer.piece(t): lp} for t, lp in zip(out["ids"], out["logprobs"], strict=True)
                ],
                "text_offset": [],
            }
        if request.get("return_token_ids"):
            choice.update(token_ids=out["ids"], prompt_token_ids=prompt_ids)
        return {
            "id": f"cmpl-{out['counter']}",
            "object": "text_completion",
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out["ids"]),
                "total_tokens": len(prompt_ids) + len(out["ids"]),
                "prompt_tokens_details": {"cached_tokens": out["cached"]},
            },
        }

    def _vllm_tokenize(self, request: dict[str, Any]) -> dict[str, Any]:
        if "messages" in request:
            tokens = self.render_ids(
                request["messages"],
                request.get("tools"),
                add_generation_prompt=bool(request.get("add_generation_prompt", True)),
                continue_final_message=bool(request.get("continue_final_message", False)),
            )
        else:
            tokens = self.tokenizer.encode(str(request.get("prompt") or ""))
        return {"count": len(tokens), "max_model_len": 32768, "tokens": tokens}

    def _sglang_generate(self, request: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = [int(t) for t in request["input_ids"]]
        out = self._from_ids(prompt_ids)
        meta: dict[str, Any] = {
            "id": f"gen-{out['counter']}",
            "finish_reason": {"type": "stop", "matched": IM_END},
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(out["ids"]),
            "cached_tokens": out["cached"],
        }
        if request.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(out["ids"], out["logprobs"], strict=True)]
        return {"text": out["text"], "output_ids": out["ids"], "meta_info": meta}

    def _llamacpp_completion(self, request: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = [int(t) for t in request["prompt"]]
        out = self._from_ids(prompt_ids)
        answer: dict[str, Any] = {
            "content": out["text"],
            "tokens": out["ids"] if request.get("return_tokens") else [],
            "model": self.model,
            "stop_type": "eos",
            "stop": True,
            "tokens_evaluated": len(prompt_ids),
            "tokens_predicted": len(out["ids"]),
            "tokens_cached": out["cached"],
            "truncated": False,
            "timings": {"prompt_n": len(prompt_ids), "predicted_n": len(out["ids"])},
        }
        if request.get("n_probs"):
            answer["completion_probabilities"] = self._entries(out["ids"], out["logprobs"], False)
        return answer

    def _llamacpp_apply_template(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = list(request.get("messages") or [])
        final_assistant = bool(messages) and messages[-1].get("role") == "assistant"  # prefilled, left open
        text = render(
            messages,
            request.get("tools"),
            add_generation_prompt=not final_assistant,
            continue_final_message=final_assistant,
            drift=self.drift,
            strip_reasoning=self.strip_reasoning,
        )
        return {"prompt": text}

    def _llamacpp_tokenize(self, request: dict[str, Any]) -> dict[str, Any]:
        tokens = self.tokenizer.encode(str(request.get("content") or ""))
        if request.get("with_pieces"):
            return {"tokens": [{"id": t, "piece": self.tokenizer.piece(t)} for t in tokens]}
        return {"tokens": tokens}
