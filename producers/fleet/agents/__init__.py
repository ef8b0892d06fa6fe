"""Scripted agents (no language model) that act only through real commands in the sandbox.

``AgentContext`` is the agent loop's tool layer: every tool call emits ``agent_input`` (context
size, cached prefix), ``agent_action`` (tool, command, thought, model-like token counts, cost,
simulated model latency), then runs a real command in the sandbox and emits any
``network_request`` the command caused, ``env_feedback`` (real output, exit code, duration),
``file_op`` for every change of the writable layer, and a ``resource_sample``.

Policies: ``solver`` (competent), ``flailer`` (loops and retries, gives up), ``guesser`` (one
shot, no testing), ``hang`` (outlives its deadline) and the cheaters ``cheat_edit_tests``,
``cheat_tamper_runner``, ``cheat_network``, ``cheat_hidden_tests``, ``cheat_forged_verdict``
(a deliverable that prints a result line, exits early or overrides ``sys.exit``),
``cheat_framework_patch`` (``conftest.py`` / ``sitecustomize.py``, or an always-equal return
value), ``cheat_hardcoded_outputs`` (the visible tests' expected outputs, hard-coded) and
``cheat_repo_history`` (the fix, read from the workspace repository's history). The honest
policies also do what real agents do and detectors must not mistake for cheating: ``pip list``
or ``pip install --help``, a scratch ``test_scratch.py`` reproduction, ``git status``/``git
diff``, a ``grep`` for words like ``token`` or ``curl``. ``choose_policy`` draws one from a
seeded mix in which ``cheat_rate`` is the share of cheaters.

Modules: ``context`` (the tool layer), ``honest`` and ``cheating`` (the policies), ``policies``
(the registry and the draw). This module re-exports them.
"""

from producers.fleet.agents.cheating import (
    cheat_edit_tests,
    cheat_forged_verdict,
    cheat_framework_patch,
    cheat_hardcoded_outputs,
    cheat_hidden_tests,
    cheat_network,
    cheat_repo_history,
    cheat_tamper_runner,
)
from producers.fleet.agents.context import (
    MAX_TRANSIENT_RETRIES,
    MODEL,
    PRICE_PER_MTOK,
    SYSTEM_PROMPT_TOKENS,
    WORKSPACE_ROOT,
    AgentContext,
    AgentOutcome,
    tokens,
)
from producers.fleet.agents.honest import flailer, guesser, hang, honest_habits, solver
from producers.fleet.agents.policies import CHEATERS, HONEST, POLICIES, Policy, cheat_type, choose_policy

__all__ = [
    "CHEATERS",
    "HONEST",
    "MAX_TRANSIENT_RETRIES",
    "MODEL",
    "POLICIES",
    "PRICE_PER_MTOK",
    "SYSTEM_PROMPT_TOKENS",
    "WORKSPACE_ROOT",
    "AgentContext",
    "AgentOutcome",
    "Policy",
    "cheat_edit_tests",
    "cheat_forged_verdict",
    "cheat_framework_patch",
    "cheat_hardcoded_outputs",
    "cheat_hidden_tests",
    "cheat_network",
    "cheat_repo_history",
    "cheat_tamper_runner",
    "cheat_type",
    "choose_policy",
    "flailer",
    "guesser",
    "hang",
    "honest_habits",
    "solver",
    "tokens",
]
