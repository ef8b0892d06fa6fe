"""A test double at the network boundary: a reasoning model behind a template that strips earlier reasoning.

:class:`ReasoningServer` is the scripted :class:`~producers.fleet.llm.testing.FakeOpenAIServer` whose
model thinks (``<think>…</think>``, sampled, so in the completion ids) on the turns ``reasoning``
says, and whose chat template leaves every earlier turn's reasoning out of the next prompt, whatever
the client sends back — as the DeepSeek-R1/V3.x reasoner, Qwen3 thinking and gpt-oss templates do.
So after a turn with reasoning the next prompt does not extend the previous prompt + completion.
The server also says which weights and engine sampled each reply (``metadata``: ``weight_version``,
``engine``, ``dtype``, as SGLang-style servers report them) and, when asked, a cost per call
(``usage.cost``, as OpenRouter does).

Used by the tests; never by the fleet itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from producers.fleet.llm.testing import FakeOpenAIServer, Script


class ReasoningServer(FakeOpenAIServer):
    """The reasoning server (start with ``with ReasoningServer(script, reasoning=…) as server``).

    Args:
        script: the next turn for a conversation.
        reasoning: the reasoning of the n-th assistant turn (0-based), None for a turn without.
        weight_version: the weights' version answering the n-th successful chat request (0-based).
        served_by: ``engine`` and ``dtype`` the server reports.
        cost_usd: a cost to report per call (``usage.cost``), None for none.
        kwargs: as :class:`FakeOpenAIServer` (``engine``: the server's response shapes).
    """

    def __init__(
        self,
        script: Script,
        reasoning: Callable[[int], str | None],
        weight_version: Callable[[int], str] = lambda n: "w0",
        served_by: dict[str, str] | None = None,
        cost_usd: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(script, reasoning=reasoning, strip_reasoning=True, **kwargs)
        self.weight_version = weight_version
        self.served_by = dict(served_by or {"engine": "toy-sglang", "dtype": "bfloat16"})
        self.cost_usd = cost_usd
        self._served = 0
        self._served_lock = threading.Lock()

    def describe(self, response: dict[str, Any]) -> None:
        """``metadata`` with the weights' version of this reply and the engine; the cost when one is set."""
        with self._served_lock:
            version = self.weight_version(self._served)
            self._served += 1
        response["metadata"] = {"weight_version": version, **self.served_by}
        if self.cost_usd is not None:
            response["usage"]["cost"] = self.cost_usd
