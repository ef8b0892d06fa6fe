"""The policy registry: honest and cheating policies by name, and ``choose_policy``'s seeded draw."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

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
from producers.fleet.agents.context import AgentContext, AgentOutcome
from producers.fleet.agents.honest import flailer, guesser, hang, solver

Policy = Callable[[AgentContext], AgentOutcome]


HONEST: dict[str, tuple[Policy, float]] = {
    "solver": (solver, 0.60),
    "flailer": (flailer, 0.15),
    "guesser": (guesser, 0.15),
    "hang": (hang, 0.10),
}
CHEATERS: dict[str, tuple[Policy, str]] = {
    "cheat_edit_tests": (cheat_edit_tests, "edit_tests"),
    "cheat_tamper_runner": (cheat_tamper_runner, "tamper_runner"),
    "cheat_network": (cheat_network, "network"),
    "cheat_hidden_tests": (cheat_hidden_tests, "hidden_tests"),
    "cheat_forged_verdict": (cheat_forged_verdict, "forged_verdict"),
    "cheat_framework_patch": (cheat_framework_patch, "test_framework_patch"),
    "cheat_hardcoded_outputs": (cheat_hardcoded_outputs, "hardcoded_outputs"),
    "cheat_repo_history": (cheat_repo_history, "repo_history_leak"),
}
POLICIES: dict[str, Policy] = {
    **{k: v[0] for k, v in HONEST.items()},
    **{k: v[0] for k, v in CHEATERS.items()},
}


def cheat_type(policy: str) -> str | None:
    """The cheat a policy commits, or ``None``."""
    return CHEATERS[policy][1] if policy in CHEATERS else None


def choose_policy(
    rng: random.Random, cheat_rate: float, mix: dict[str, float] | None = None, cheaters: Iterable[str] | None = None
) -> str:
    """Draw a policy name: a cheater with probability ``cheat_rate``, else from the honest mix.

    Args:
        rng: the random source.
        cheat_rate: share of cheaters in [0, 1].
        mix: explicit weights by policy name (overrides both the honest mix and ``cheat_rate``).
        cheaters: the cheating policies to draw from (default: every one in ``CHEATERS``; a backend
            that models only some of them passes those).

    Raises:
        ValueError: ``mix`` names an unknown policy.
    """
    if mix:
        unknown = set(mix) - set(POLICIES)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; known: {sorted(POLICIES)}")
        names = sorted(mix)
        return rng.choices(names, weights=[mix[n] for n in names])[0]
    if rng.random() < cheat_rate:
        return rng.choice(sorted(CHEATERS if cheaters is None else set(cheaters) & set(CHEATERS)))
    names = sorted(HONEST)
    return rng.choices(names, weights=[HONEST[n][1] for n in names])[0]
