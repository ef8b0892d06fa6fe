"""Model prices: USD per million tokens per model, set by the user (``TRAJLAKE_PRICE_TABLE``).

Costs are priced when they are read, not when a session runs: events record token counts (and a
cost only where the server reported one, e.g. OpenRouter's ``usage.cost`` or a LiteLLM proxy's
``x-litellm-response-cost``), and the ``trajectories`` view, the ``costs`` view and every export
price the rest with this table. Changing the table changes every cost without re-ingesting or
re-assembling anything. A model without an entry costs 0: an invented price would be a wrong
number that looks right.

The table is a JSON object (inline, or the path of a file holding it)::

    {"gpt-4o": {"input": 2.5, "cached": 1.25, "output": 10.0},
     "Qwen/Qwen3-8B": {"input": 0.05, "output": 0.25}}

``cached`` (a prompt-cache hit) defaults to ``input``. Keys are the model name a request named
(else the name the server answered with). Prices are kept to a millionth of a dollar per
million tokens, so every per-call cost is an exact decimal with at most 12 places and the cost
of a session is the exact sum of the costs of its calls, in SQL and in Python alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from common.errors import ConfigError

#: Price resolution: a millionth of a dollar per million tokens (1e-12 dollars per token).
PRICE_QUANTUM = Decimal("0.000001")
#: Cost resolution: every cost is an exact multiple of this (dollars).
COST_QUANTUM = Decimal("1e-12")
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    """USD per million tokens: uncached prompt tokens, cached prompt tokens, completion tokens."""

    input: Decimal
    cached: Decimal
    output: Decimal

    def per_token(self) -> tuple[Decimal, Decimal, Decimal]:
        """(input, cached, output) USD per token, exact to 12 places."""
        return (self.input / _MILLION, self.cached / _MILLION, self.output / _MILLION)


def _amount(model: str, key: str, value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"price table: {model!r}.{key} must be a number, got {value!r}")
    try:
        amount = Decimal(str(value)).quantize(PRICE_QUANTUM)
    except InvalidOperation:
        raise ConfigError(f"price table: {model!r}.{key} must be a number, got {value!r}") from None
    if not amount.is_finite() or amount < 0 or amount >= 10**6:
        raise ConfigError(f"price table: {model!r}.{key} must be in [0, 1e6) USD per million tokens, got {value!r}")
    return amount


@dataclass(frozen=True)
class PriceTable:
    """Prices by model name; :meth:`cost` of a call, 0 for a model without a price."""

    prices: Mapping[str, Price] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> PriceTable:
        """A table from its JSON object.

        Raises:
            ConfigError: not an object of ``{"input": n, "cached": n, "output": n}`` objects.
        """
        if not isinstance(data, dict):
            raise ConfigError("price table: must be a JSON object of model -> {input, cached, output}")
        prices: dict[str, Price] = {}
        for model, entry in data.items():
            if not isinstance(entry, dict) or not {"input", "output"} <= set(entry):
                raise ConfigError(f"price table: {model!r} needs 'input' and 'output' (and optionally 'cached')")
            unknown = set(entry) - {"input", "cached", "output"}
            if unknown:
                raise ConfigError(f"price table: {model!r} has unknown keys {sorted(unknown)}")
            prompt = _amount(model, "input", entry["input"])
            cached = _amount(model, "cached", entry.get("cached", entry["input"]))
            prices[str(model)] = Price(prompt, cached, _amount(model, "output", entry["output"]))
        return cls(prices)

    @classmethod
    def load(cls, spec: str) -> PriceTable:
        """A table from a setting: inline JSON (starting with ``{``), a file path, or empty (no prices).

        Raises:
            ConfigError: the file is unreadable or the JSON is not a price table.
        """
        text = spec.strip()
        if not text:
            return cls()
        if not text.startswith("{"):
            path = Path(text).expanduser()
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"price table {path}: cannot read it ({exc.strerror or exc})") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"price table: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        return cls.parse(data)

    def price(self, model: str | None) -> Price | None:
        """The price of ``model``, None when the table has none."""
        return self.prices.get(model) if model else None

    def cost(
        self, model: str | None, prompt_tokens: int | None, cached_tokens: int | None, output: int | None
    ) -> Decimal:
        """USD of one call (cached prompt tokens at the cached price); 0 for a model without a price."""
        price = self.price(model)
        if price is None:
            return Decimal(0)
        prompt, cached = int(prompt_tokens or 0), int(cached_tokens or 0)
        per_input, per_cached, per_output = price.per_token()
        return (prompt - cached) * per_input + cached * per_cached + int(output or 0) * per_output

    def rows(self) -> Iterable[tuple[str, str, str, str]]:
        """(model, input, cached, output) USD per token as decimal strings (the SQL ``model_prices`` table)."""
        for model, price in sorted(self.prices.items()):
            per_input, per_cached, per_output = price.per_token()
            yield (model, str(per_input), str(per_cached), str(per_output))

    def as_json(self) -> dict[str, dict[str, float]]:
        """The table as plain JSON (USD per million tokens), for manifests."""
        return {
            model: {"input": float(p.input), "cached": float(p.cached), "output": float(p.output)}
            for model, p in sorted(self.prices.items())
        }


def exact_cost(value: float | None) -> Decimal:
    """A recorded cost (a float) as the exact decimal it stands for, to 12 places (0 for None)."""
    if value is None:
        return Decimal(0)
    return Decimal(repr(float(value))).quantize(COST_QUANTUM)
