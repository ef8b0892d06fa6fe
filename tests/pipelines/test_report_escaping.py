"""Trajectories are hostile input: whatever text a run holds, the report's HTML and the terminal view
show it as text.

Generated sessions put arbitrary strings (markup, quotes, control characters, unpaired surrogates
aside) in every field a page or the terminal prints; the page must contain only the tags and
attributes the report itself writes, and the text must come back unchanged when the page is read.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from common.text import is_printable, printable
from pipelines.report.data import Overview
from pipelines.report.html import overview_html, session_html
from pipelines.report.inspect import SessionDetail, file_changes, parse_json
from pipelines.report.svg import bar_chart, histogram
from trajlake.show import clean, render_session

#: Every tag the report writes itself; nothing from a trajectory may add one.
TAGS = {
    "html", "head", "meta", "title", "style", "body", "p", "a", "h1", "h2", "table", "thead", "tbody", "tr", "th",
    "td", "pre", "span", "div", "b", "i", "code", "ul", "li", "details", "summary", "br", "svg", "rect", "text",
    "line", "input", "select", "option", "label", "button", "script",
}  # fmt: skip
ATTRIBUTES = {
    "lang", "charset", "http-equiv", "content", "name", "href", "class", "id", "xmlns", "role", "aria-label",
    "width", "height", "viewbox", "font-family", "font-size", "x", "y", "x1", "x2", "y1", "y2", "fill", "stroke",
    "text-anchor", "type", "size", "placeholder", "data-shards", "data-total", "hidden", "value", "disabled", "src",
}  # fmt: skip

hostile = st.text(
    alphabet=st.characters(exclude_categories=["Cs"]), max_size=60
) | st.sampled_from(
    ["<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "</pre><script>", "javascript:alert(1)",
     "\x1b[2J\x1b]0;owned\x07", "<!--", "]]>", "&amp;&lt;", "'; DROP TABLE x; --", "\u202egnp.exe"]
)  # fmt: skip


class Tags(HTMLParser):
    """Collects the tags and attributes of a page, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.text: list[str] = []
        self.scripts: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)
        if tag == "script":
            self.scripts.append(dict(attrs).get("src"))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _read(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser


def _detail(value: str, evidence: Any) -> SessionDetail:
    step = {
        "step_index": 0,
        "tool_name": value,
        "command": value,
        "thought": value,
        "output": value,
        "exit_code": 1,
        "arguments_json": {"path": value, "content": value},
        "action_event_id": "e1",
        "feedback_event_id": "e2",
    }
    write = {**step, "step_index": 1, "tool_name": "write_file", "action_event_id": "e3", "feedback_event_id": "e4"}
    detail = SessionDetail(
        trajectory={"session_id": value, "task_id": value, "status": value, "instruction": value, "host_id": value},
        steps=[step, write],
        flags=[{"flag": value, "flag_class": value, "severity": value, "evidence": json.dumps(evidence)}],
        evaluation={"passed": False, "evaluator": value, "details": value},
        network=[{"seq": 3, "host": value, "port": 80, "allowed": False, "error": value}],
        annotations=[{"seq": 4, "key": value, "value": value}],
        model_calls=[{"seq": 5, "model": value, "status": value}],
        submission=value,
        event_steps={"e1": 0, "e2": 0},
    )
    detail.flags[0]["evidence_json"] = parse_json(detail.flags[0]["evidence"])
    detail.changes = file_changes(detail.steps)
    return detail


evidence = st.recursive(
    st.none() | st.booleans() | st.integers() | hostile,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile, inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.fuzz
@settings(deadline=None)
@given(value=hostile, evidence=evidence)
def test_a_session_page_holds_only_its_own_markup(value: str, evidence: Any) -> None:
    page = session_html(_detail(value, {"reasons": [value], "event_ids": ["e1", value], "x": evidence}), "i", NOW)
    parsed = _read(page)
    assert parsed.tags <= TAGS - {"script"}, parsed.tags - TAGS  # a session page runs nothing
    assert parsed.attributes <= ATTRIBUTES, parsed.attributes - ATTRIBUTES
    shown = printable(value).strip()
    if shown:
        assert shown in "".join(parsed.text)  # shown, as text (controls and bidi made visible)
    assert is_printable("".join(parsed.text))


@pytest.mark.fuzz
@settings(deadline=None)
@given(value=hostile, counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=30))
def test_the_overview_and_its_plots_hold_only_their_own_markup(value: str, counts: list[int]) -> None:
    data = Overview(scope=value, export={"export_id": value, "format": value, "filters": {value: value}})
    data.totals = {"sessions": 3, "passed": 1, "evaluated": 2}
    data.families = [{"task_family": value, "sessions": 3, "evaluated": 2, "passed": 1, "mean_quality": 0.5,
                      "mean_cost_usd": 0.1, "flagged": 1}]  # fmt: skip
    data.statuses, data.failure_causes = [(value, 1)], [(value, 2)]
    data.quality_bins, data.cost_bins, data.cost_high = counts, counts, 1.0
    flag = {"flag": value, "flag_class": value, "severity": value, "evidence": value}
    data.flagged = [{"session_id": value, "task_family": value, "status": value, "flags": [flag]}]
    row = dict.fromkeys(("eval_passed", "n_steps", "quality", "cost_usd"))
    data.listed = [{**row, "session_id": value, "task_family": value, "status": value, "started_at": value}]
    page = overview_html(data, lambda s: f"sessions/{s}.html", NOW)
    page += bar_chart([(value, 0.5, value)], title=value) + histogram(counts, 0, 1, value, title=value)
    parsed = _read(page)
    assert parsed.tags <= TAGS and parsed.attributes <= ATTRIBUTES, (parsed.tags - TAGS, parsed.attributes)
    assert parsed.scripts == ["sessions/search.js"]  # the report's own search, and nothing a value could add
    assert is_printable("".join(parsed.text))


@pytest.mark.fuzz
@settings(deadline=None)
@given(value=hostile, full=st.booleans())
def test_the_terminal_view_sends_no_control_character(value: str, full: bool) -> None:
    assert is_printable(clean(value))
    console = Console(record=True, width=100, force_terminal=False, color_system=None)
    render_session(console, _detail(value, {"reasons": [value], "commands": [value], "paths": [value]}), full=full)
    printed = console.export_text()
    assert is_printable(printed), [c for c in printed if not is_printable(c)]


NOW = datetime(2026, 12, 2, tzinfo=UTC)
