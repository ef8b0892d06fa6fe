"""The one sanitizer: no generated string reaches the terminal with a control character.

:func:`common.text.printable` is checked on its own, then through every way text is printed: the
CLI's consoles (whatever a command formats, on a terminal with colours), ``trajlake sql`` tables,
and the messages ``trajlake import --verdicts`` prints for instance ids no session has.
"""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.text import UNSAFE, is_printable, printable
from trajlake.console import SafeConsole
from warehouse.sql_output import escape_controls, format_rows

#: Strings made of what a terminal acts on, mixed with text: escape sequences (OSC 52 clipboard,
#: OSC 8 links, CSI), C1 controls, bidi controls, separators and lone surrogates.
ATTACKS = [
    "\x1b]52;c;cm0gLXJmIH4=\x07",
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "\x1b[2J\x1b[H",
    "\x9b31m",
    "\x9d0;title\x9c",
    "\u202etxt.exe",
    "\u2066isolated\u2069",
    "line\u2028break",
    "\ud800",
    "a\rb",
    "\x08\x7f",
]
texts = st.text() | st.sampled_from(ATTACKS) | st.lists(st.sampled_from(ATTACKS) | st.text(max_size=5)).map("".join)
#: The styles rich itself writes on a colour terminal (SGR); nothing else may carry an ESC.
_SGR = re.compile(r"\x1b\[[0-9;]*m")


@given(texts)
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    for multiline in (True, False):
        shown = printable(text, multiline=multiline)
        assert is_printable(shown, multiline=multiline)
        assert not UNSAFE.search(shown.replace("\n", "").replace("\t", "")) if multiline else not UNSAFE.search(shown)
        shown.encode("utf-8")  # never an unencodable surrogate


@given(st.text(alphabet=st.characters(blacklist_characters="\r", blacklist_categories=["Cc", "Cs", "Zl", "Zp"])))
def test_printable_text_is_left_as_it_is(text: str) -> None:
    if not UNSAFE.search(text):
        assert printable(text) == text and printable(text, multiline=False) == text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
        ("\u202eexe", "\\u202eexe"),
        ("a\r\nb", "a\nb"),
        ("\x9b", "\\x9b"),
    ],
)
def test_escapes_are_visible(text: str, shown: str) -> None:
    assert printable(text) == shown


@settings(deadline=None)
@given(texts)
def test_the_cli_consoles_write_only_printable_text_and_their_own_styles(text: str) -> None:
    buffer = io.StringIO()
    console = SafeConsole(file=buffer, force_terminal=True, color_system="truecolor", width=100, soft_wrap=True)
    console.print(text, markup=False)
    console.print(f"[bold red]error:[/] {text}", markup=False)
    console.print(text, style="bold", markup=False, highlight=True)
    written = _SGR.sub("", buffer.getvalue())
    assert is_printable(written), [c for c in written if not is_printable(c)]


@given(st.lists(texts, min_size=1, max_size=4))
def test_sql_tables_use_the_same_sanitizer(values: list[str]) -> None:
    table = format_rows([f"c{i}" for i in range(len(values))], [tuple(values)], "table")
    assert is_printable(table)
    assert all(escape_controls(v) == printable(v, multiline=False) for v in values)
