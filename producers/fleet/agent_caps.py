"""Per-session action caps and budgets: steps, model calls, model tokens, cost and the wall-clock deadline.

A cap ends the agent's phase (evaluation follows as for any session) and names itself in the
session's ``exit_reason``: ``max_steps``, ``max_model_calls``, ``max_model_tokens``,
``max_cost_usd`` or ``deadline``. A step is every tool call the model made, a malformed one or one
naming an unknown tool included; a model call is every call, whatever its answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

CAP_REASONS = ("max_steps", "max_model_calls", "max_model_tokens", "max_cost_usd", "deadline")


class CapReached(Exception):
    """A session reached one of its caps; ``reason`` is the ``exit_reason`` it ends with.

    Args:
        reason: one of :data:`CAP_REASONS`.
        detail: what was measured against what limit.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Caps:
    """The limits of one session (``None``: unlimited).

    Args:
        max_steps: tool calls the agent may make.
        max_model_calls: model calls a live model agent may make.
        max_model_tokens: prompt + completion tokens over all model calls.
        max_cost_usd: model cost.
        deadline: ``time.monotonic()`` value after which the agent may start nothing new.
    """

    max_steps: int | None = None
    max_model_tokens: int | None = None
    max_cost_usd: float | None = None
    deadline: float | None = None
    max_model_calls: int | None = None

    def check(self, *, steps: int, model_tokens: int, cost_usd: float, model_calls: int = 0) -> None:
        """Raise when the next step would exceed a cap.

        Raises:
            CapReached: naming the first cap reached.
        """
        if self.max_steps is not None and steps >= self.max_steps:
            raise CapReached("max_steps", f"{steps} steps of {self.max_steps}")
        if self.max_model_calls is not None and model_calls >= self.max_model_calls:
            raise CapReached("max_model_calls", f"{model_calls} model calls of {self.max_model_calls}")
        if self.max_model_tokens is not None and model_tokens >= self.max_model_tokens:
            raise CapReached("max_model_tokens", f"{model_tokens} tokens of {self.max_model_tokens}")
        if self.max_cost_usd is not None and cost_usd >= self.max_cost_usd:
            raise CapReached("max_cost_usd", f"${cost_usd:.6f} of ${self.max_cost_usd:.6f}")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise CapReached("deadline", "the session's wall-clock deadline passed")

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (``None`` without one)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
