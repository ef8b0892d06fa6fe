"""A test double at the network boundary: an OpenAI-compatible chat-completions server on loopback.

No model runs here. :class:`FakeOpenAIServer` is a real HTTP/1.1 server (``http.server`` in a
thread, keep-alive) that answers ``POST /v1/chat/completions`` from a *script*: a function of
the request's messages returning the next assistant turn (text and/or tool calls). It answers
the way vLLM's OpenAI server does when asked for ``logprobs`` and ``return_token_ids``: tool
calls, ``usage`` with ``prompt_tokens_details.cached_tokens``, ``prompt_token_ids`` and
``choices[0].token_ids``, and ``logprobs.content[]`` (``token_id:N`` tokens with
``return_tokens_as_token_ids``). Its tokenizer is a toy (one id per word of the canonical
message, with role markers), chosen so a conversation's next prompt extends the previous
prompt + completion, as a chat template does. ``fail_next`` queues HTTP errors (429, 500 …) to
answer before the next successful responses. Every response body is kept in ``responses``
(raw bytes) so tests can compare what landed with what the server sent.

Used by the tests and by ``trajlake bench agents``; never by the fleet itself.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from producers.fleet.llm.record import canonical
from producers.fleet.tasks import TaskInstance


@dataclass
class Turn:
    """One scripted assistant turn: text and tool calls (name, arguments)."""

    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


Script = Callable[[list[dict[str, Any]]], Turn]

_ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


def toy_tokens(message: dict[str, Any]) -> list[int]:
    """The toy tokenizer: role marker, then one id per whitespace-separated word of the message."""
    body = canonical({k: v for k, v in message.items() if k != "role"})
    return [0, _ROLES.get(str(message.get("role")), 5)] + [10 + zlib.crc32(w.encode()) % 50_000 for w in body.split()]


def assistant_of(turn: Turn, call_prefix: str) -> dict[str, Any]:
    """The assistant message of a scripted turn, with tool call ids ``{call_prefix}_{i}``."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"{call_prefix}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, sort_keys=True)},
            }
            for i, (name, args) in enumerate(turn.tool_calls)
        ]
    return message


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


class FakeOpenAIServer:
    """The scripted OpenAI-compatible server (start with ``with FakeOpenAIServer(script) as server``).

    Args:
        script: the next turn for a conversation.
        delay_s: the server's own latency per successful response.
        seed: logprob values.
        model: reported as ``model``.
    """

    def __init__(self, script: Script, delay_s: float = 0.0, seed: int = 0, model: str = "fake-vllm") -> None:
        self.script = script
        self.delay_s = delay_s
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.responses: list[bytes] = []
        self.statuses: list[int] = []
        self.server_ms: list[float] = []
        self.fail_next: list[int] = []
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._last_prompt: dict[str, list[int]] = {}  # conversation → last prompt ids (a prefix cache)
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    def _answer(self, path: str, request: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            self.requests.append(request)
            failure = self.fail_next.pop(0) if self.fail_next else None
        if path.rstrip("/") != "/v1/chat/completions":
            return 404, b'{"error": {"message": "not found"}}', {}
        if failure is not None:
            with self._lock:
                self.statuses.append(failure)
            body = json.dumps({"error": {"message": f"injected {failure}", "code": failure}}).encode()
            return failure, body, {"Retry-After": "0"} if failure == 429 else {}
        messages = list(request.get("messages") or [])
        turn = self.script(messages)
        with self._lock:
            self._counter += 1
            call_id = f"chatcmpl-{self._counter}"
        assistant = assistant_of(turn, f"call_{self._counter}")
        prompt_ids = [t for m in messages for t in toy_tokens(m)]
        completion_ids = toy_tokens(assistant)
        conversation = canonical(messages[:2])
        with self._lock:
            previous = self._last_prompt.get(conversation, [])
            cached = 0
            while cached < min(len(previous), len(prompt_ids)) and previous[cached] == prompt_ids[cached]:
                cached += 1
            self._last_prompt[conversation] = prompt_ids + completion_ids
            logprobs = [-round(self._rng.random() * 3, 6) for _ in completion_ids]
        if self.delay_s:
            time.sleep(self.delay_s)
        choice: dict[str, Any] = {
            "index": 0,
            "message": assistant,
            "finish_reason": "tool_calls" if turn.tool_calls else "stop",
        }
        as_ids = bool(request.get("return_tokens_as_token_ids"))
        if request.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}" if as_ids else f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(completion_ids, logprobs, strict=True)
                ]
            }
        response: dict[str, Any] = {
            "id": call_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        if request.get("return_token_ids"):
            choice["token_ids"] = completion_ids
            response["prompt_token_ids"] = prompt_ids
        body = json.dumps(response).encode()
        with self._lock:
            self.responses.append(body)
            self.statuses.append(200)
        return 200, body, {}
