"""The public agent interface: bring your own agent to the local fleet.

An agent is a callable taking one :class:`AgentSession`::

    def my_agent(session):
        listing = session.run("ls")
        code = session.read_file("solution.py")
        session.write_file("solution.py", code.replace("return a - b", "return a + b"))
        if session.run("python3 run_tests.py").exit_code == 0:
            session.submit()

``trajlake fleet run --backend local --agent SPEC`` accepts a built-in policy name
(``solver``, ``flailer``, … from ``producers.fleet.agents``), ``llm`` (the OpenAI-compatible
agent of ``producers.fleet.llm``), ``module:callable`` or ``path/to/file.py:callable``.

Every session call goes through the same tool layer as the scripted policies
(``AgentContext.call``): an ``agent_action``, the real command in the sandbox, any
``network_request``, ``env_feedback``, a ``file_op`` per change and a ``resource_sample``. The
session's caps (``producers.fleet.agent_caps``) are checked before every call. An agent that
raises ends its session as ``failed`` with ``exit_reason`` ``agent_raised`` and the traceback in
an ``annotation`` event; the fleet goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.errors import AgentSpecError, AgentToolError
from producers.fleet.agents import POLICIES, AgentContext

#: Exit code reported when the sandbox gave none (a command killed at its timeout).
NO_EXIT_CODE = -1


@dataclass(frozen=True)
class RunResult:
    """What ``AgentSession.run`` returns.

    Attributes:
        exit_code: the command's exit status (``-1`` when it was killed without one).
        output: stdout and stderr, interleaved, as the sandbox captured them (maybe truncated).
        duration_ms: the command's wall time.
        truncated: the output was cut at the sandbox's output limit.
    """

    exit_code: int
    output: str
    duration_ms: float = 0.0
    truncated: bool = False


def workspace_path(path: str) -> str:
    """``path`` normalised relative to the workspace root.

    Raises:
        AgentToolError: an absolute path, a path leaving the workspace (``..``), an empty path or a NUL byte.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise AgentToolError(f"not a workspace path: {path!r}")
    if path.startswith("/"):
        raise AgentToolError(f"paths are relative to the workspace; refused absolute path {path!r}")
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../") or normal == ".":
        raise AgentToolError(f"refused {path!r}: it leaves the workspace")
    return normal


class AgentSession:
    """What an agent sees: the task's instruction and four tools, each a recorded sandbox call.

    Args:
        ctx: the session's tool layer (emitter, sandbox, caps).
    """

    def __init__(self, ctx: AgentContext) -> None:
        self._ctx = ctx
        self.submitted = False
        self._calls = 0

    @property
    def context(self) -> AgentContext:
        """The tool layer underneath (for built-in agents that record more, like the LLM agent's model calls)."""
        return self._ctx

    @property
    def instruction(self) -> str:
        """The task as the agent should see it."""
        return self._ctx.task.instruction

    def _turn(self, turn: dict[str, Any] | None) -> None:
        """Set the action fields of the next call (a live model's; else no simulated model at all)."""
        self._ctx.live_turn = turn if turn is not None else {"tool_call_id": f"call_{self._calls}"}
        self._calls += 1

    def _open(self) -> None:
        if self.submitted:
            raise AgentToolError("the session was submitted; no more tool calls")

    def run(self, command: str, timeout: float | None = None, *, turn: dict[str, Any] | None = None) -> RunResult:
        """Run a shell command in the workspace.

        Args:
            command: a ``/bin/sh`` command line.
            timeout: seconds before the command is killed (default: the sandbox's).
            turn: action fields recorded with the call (``tool_call_id``, tokens …); for model-driven agents.

        Returns:
            exit code and output.

        Raises:
            AgentToolError: after ``submit()``.
            CapReached: a cap of the session was reached.
        """
        self._open()
        self._turn(turn)
        result = self._ctx.call("bash", command, "", {"command": command}, timeout=timeout)
        code = result.exit_code if result.exit_code is not None else NO_EXIT_CODE
        return RunResult(code, result.output, result.duration_ms, result.truncated)

    def read_file(self, path: str, *, turn: dict[str, Any] | None = None) -> str:
        """The text of a workspace file.

        Raises:
            AgentToolError: a path outside the workspace, or the file cannot be read.
            CapReached: a cap of the session was reached.
        """
        self._open()
        rel = workspace_path(path)
        self._turn(turn)
        result = self._ctx.read_file(rel, "")
        if result.exit_code != 0:
            raise AgentToolError(f"cannot read {rel}: {result.output.strip()[:200]}")
        return result.output

    def write_file(self, path: str, text: str, *, turn: dict[str, Any] | None = None) -> None:
        """Create or replace a workspace file (parent directories are created).

        Raises:
            AgentToolError: a path outside the workspace, or the write failed.
            CapReached: a cap of the session was reached.
        """
        self._open()
        rel = workspace_path(path)
        if not isinstance(text, str):
            raise AgentToolError(f"write_file({rel!r}) needs text, got {type(text).__name__}")
        self._turn(turn)
        result = self._ctx.write_file(rel, text, "")
        if result.exit_code != 0:
            raise AgentToolError(f"cannot write {rel}: {result.output.strip()[:200]}")

    def submit(self) -> None:
        """End the agent's phase; evaluation follows."""
        self.submitted = True


Agent = Callable[[AgentSession], Any]


@dataclass(frozen=True)
class AgentSpec:
    """A resolved ``--agent`` value.

    Attributes:
        spec: the value as given (recorded in ``session_start``'s ``extra['agent_spec']``).
        kind: ``policy`` (a built-in scripted policy), ``llm`` or ``callable``.
        func: the callable of ``kind == 'callable'``.
    """

    spec: str
    kind: str
    func: Agent | None = None

    @property
    def label(self) -> str:
        """The name written to the ground-truth labels' ``policy``."""
        return self.spec if self.kind == "policy" else ("llm" if self.kind == "llm" else f"custom:{self.spec}")


def _load_file(path: Path) -> Any:
    name = f"trajlake_agent_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AgentSpecError(f"cannot load agent file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise AgentSpecError(f"agent file {path} failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def resolve_agent(spec: str) -> AgentSpec:
    """Resolve ``--agent SPEC``.

    Args:
        spec: a built-in policy name, ``llm``, ``module:callable`` or ``path/to/file.py:callable``.

    Returns:
        The resolved spec.

    Raises:
        AgentSpecError: nothing of that name, an import failure, or an attribute that is not callable.
    """
    if spec in POLICIES:
        return AgentSpec(spec, "policy")
    if spec == "llm":
        return AgentSpec(spec, "llm")
    if ":" not in spec:
        raise AgentSpecError(
            f"unknown agent {spec!r}: use a built-in policy ({', '.join(sorted(POLICIES))}), 'llm', "
            "'module:callable' or 'path/to/file.py:callable'"
        )
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise AgentSpecError(f"agent file {where} does not exist")
        module = _load_file(path)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise AgentSpecError(f"cannot import agent module {where!r}: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise AgentSpecError(f"{where} has no callable {attr!r}")
    return AgentSpec(spec, "callable", func)
