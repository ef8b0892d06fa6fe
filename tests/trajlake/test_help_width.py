"""Help at 80 columns: every command's help fits the width and says everything, wrapped, never cut."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer.main

from trajlake.cli import app

ROOT_COMMAND = typer.main.get_command(app)


def _commands(command: Any = ROOT_COMMAND, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _help(path: tuple[str, ...]) -> str:
    ctx = ROOT_COMMAND.make_context("trajlake", [], resilient_parsing=True)
    command: Any = ROOT_COMMAND
    for name in path:
        command = command.commands[name]
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    return command.get_help(ctx)


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "trajlake")
def test_help_fits_80_columns_and_holds_every_summary_and_option_help_in_full(
    path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(path)
    assert "╭" not in text and "│" not in text  # click's plain layout, not rich's squeezed tables
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert too_wide == []
    flowing = _words(text)
    command = dict(COMMANDS)[path]
    for sub in getattr(command, "commands", {}).values():
        summary = sub.get_short_help_str(limit=1_000)
        assert _words(summary) in flowing, summary  # whole, not cut with "..."
    for param in command.params:
        if getattr(param, "help", None):
            assert _words(param.help) in flowing, param.help
