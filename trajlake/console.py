"""What the command line prints besides results: one-line errors, notes, and progress bars.

Errors and notes go to stderr; progress is drawn on stderr only when it is a terminal, so a
log file or a pipe sees the command's result lines and nothing else.

Every console here is a :class:`SafeConsole`: whatever text it writes (a session id, a verdict
file's instance id, an error naming a path) passes :func:`common.text.printable` segment by
segment, so no input-derived string reaches the terminal as a control sequence, whichever
command printed it and however it was formatted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from common.text import printable

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import Task

    from common.progress import Progress


class SafeConsole(Console):
    """A rich console that writes every text segment through :func:`common.text.printable`.

    Rich's own control segments (cursor moves of a progress bar) and the styles it renders are
    left alone; the text between them never carries a control character, a bidi control or an
    escape sequence.
    """

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """As :meth:`rich.console.Console.print`, with text arguments made printable first (rich would
        drop a few controls, such as ``BEL``, silently; here every one is shown)."""
        super().print(*(printable(o) if isinstance(o, str) else o for o in objects), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(printable(segment.text), segment.style, None) for segment in buffer
        )


err = SafeConsole(stderr=True, soft_wrap=True)  # an error is one line, however long (no wrapping at 80 columns)
out = SafeConsole(highlight=False, soft_wrap=True)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(printable(text).split())


def print_error(message: str) -> None:
    """One red ``error:`` line on stderr; ``message`` is printed as is (no markup)."""
    err.print(f"[bold red]error:[/] {escape(one_line(message))}", markup=True, highlight=False)


def print_note(message: str) -> None:
    """One dim note line on stderr (where a lakehouse was created, what was left running)."""
    err.print(f"[dim]{escape(one_line(message))}[/]", markup=True, highlight=False)


def progress_enabled() -> bool:
    """Whether progress is drawn: stderr is a terminal and ``TERM`` is not ``dumb``."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


class _Bar:
    """A :class:`common.progress.Progress` drawing one rich task (thread-safe: rich locks its tasks)."""

    def __init__(self, progress: RichProgress, label: str) -> None:
        self._progress = progress
        self._task = progress.add_task(escape(label), total=None, unit="items")  # "fleet[local]" is no markup

    def __call__(self, done: int, total: int | None = None, unit: str = "items") -> None:
        self._progress.update(self._task, completed=done, total=total, unit=unit)


def _rate(task: Task) -> str:
    speed = task.finished_speed or task.speed
    return f"{speed:,.1f} {task.fields.get('unit', 'items')}/s" if speed else ""


@contextmanager
def progress_bar(label: str) -> Iterator[Progress | None]:
    """A progress sink for one stage: a bar (done/total, rate, ETA) on a terminal, else ``None``.

    The bar is removed when the stage ends; the command's own summary line follows.
    """
    if not progress_enabled():
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(_rate(task), style="progress.data.speed")

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        RateColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, refresh_per_second=8) as progress:
        yield _Bar(progress, label)
