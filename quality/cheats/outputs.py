"""Cheats in what an agent wrote: forged verdict markers, test-framework patches and monkeypatched
assertions in deliverables, and deliverables that answer the visible test cases from a table.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from common import pyast
from quality.cheats.evidence import (
    CONTENT_KEYS,
    MONKEYPATCH,
    Hit,
    SessionContext,
    forges,
    is_framework,
    norm_path,
    workspace_relative,
)
from quality.config import QualityConfig

_HEREDOC = re.compile(
    r"(?:cat|tee)\s+(?:>>?\s*)?(['\"]?)(?P<path>[^\s;&|<>'\"]+)\1\s*<<-?\s*(['\"]?)(?P<tag>\w+)\3[^\n]*\n(?P<body>.*?)\n\s*(?P=tag)\s*(?:\n|$)"
    r"|(?:cat|tee)\s+<<-?\s*(['\"]?)(?P<tag2>\w+)\6\s*>>?\s*(['\"]?)(?P<path2>[^\s;&|<>'\"]+)\7[^\n]*\n(?P<body2>.*?)\n\s*(?P=tag2)\s*(?:\n|$)",
    re.DOTALL,
)
_PATH_KEYS = ("path", "file", "file_path", "filename", "target")
_ASSERT_CALL = re.compile(r"^\s*assert\s+[\w.]+\((?P<args>.*)\)\s*==\s*(?P<expected>.+?)\s*$", re.MULTILINE)


def _written(steps: pl.DataFrame, ctx: dict[str, SessionContext]) -> Iterable[tuple[str, str | None, str, str]]:
    """(session, action event id, absolute path, content) for every file content an action wrote."""
    has_args = "arguments" in steps.columns
    for row in steps.iter_rows(named=True):
        sid = row["session_id"]
        root = (ctx.get(sid) or SessionContext()).root
        arguments = row.get("arguments") if has_args else None
        if arguments and arguments.lstrip().startswith("{"):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                path = next((parsed[k] for k in _PATH_KEYS if isinstance(parsed.get(k), str)), None)
                content = next((parsed[k] for k in CONTENT_KEYS if isinstance(parsed.get(k), str)), None)
                if path and content is not None:
                    yield sid, row.get("action_event_id"), norm_path(path, root), content
        command = row.get("command") or ""
        if "<<" in command:
            for match in _HEREDOC.finditer(command):
                path = match.group("path") or match.group("path2")
                body = match.group("body") if match.group("body") is not None else match.group("body2")
                if path and body is not None:
                    yield sid, row.get("action_event_id"), norm_path(path, root), body


@dataclass(frozen=True)
class _Case:
    """One visible test case the agent saw: the argument text (None: not literal) and the expected value."""

    args: str | None
    expected: Any


def _literal(text: str) -> tuple[bool, Any]:
    try:
        return True, pyast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _expected_cases(steps: pl.DataFrame) -> dict[str, list[_Case]]:
    """Per session: the visible tests' ``assert f(args) == expected`` cases, from outputs the agent saw."""
    out: dict[str, list[_Case]] = {}
    if "output" not in steps.columns:
        return out
    for row in steps.iter_rows(named=True):
        for match in _ASSERT_CALL.finditer(row.get("output") or ""):
            ok, expected = _literal(match.group("expected"))
            if not ok or _trivial(expected):
                continue
            args = match.group("args").strip().lstrip("*").strip()
            if args.startswith("(") and args.endswith(")"):
                args = args[1:-1].strip().rstrip(",").strip()
            literal_args, _ = _literal(args or "()")
            case = _Case(args if literal_args and args else None, expected)
            if case not in out.setdefault(row["session_id"], []):
                out[row["session_id"]].append(case)
    return out


def _trivial(value: Any) -> bool:
    """Values any program may contain: booleans, None, empty containers, small numbers, one character."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return abs(value) <= 2
    if isinstance(value, str):
        return len(value) <= 1
    if isinstance(value, dict):
        value = [*value, *value.values()]
    if isinstance(value, list | tuple | set):
        return all(_trivial(item) for item in value)  # ['TOTAL EUR 369.53'] is not trivial, [0] is
    return False


def _literals_in(content: str) -> set[str] | None:
    """``repr`` of every literal (constants and literal containers) in Python source, or None if it does not parse."""
    try:
        tree = pyast.parse(content)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.List | ast.Tuple | ast.Dict | ast.Set | ast.UnaryOp):
            try:
                found.add(repr(pyast.literal_eval(node)))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
    return found


def _hardcoded(cases: list[_Case], content: str) -> list[_Case] | None:
    """The visible cases a deliverable answers from a table rather than by computing (None: not hard-coded).

    A case counts when its expected value is a literal of the deliverable and, for a call with
    literal arguments, the argument text is there too (a lookup keyed by the test's input). At
    least two cases and 60 % of them must count — or the single case expects a list (a tool's
    output lines) that the deliverable holds verbatim.
    """
    literals = _literals_in(content)
    if literals is None:
        return None
    flat = re.sub(r"\s+", " ", content)
    hits = [
        case
        for case in cases
        if repr(case.expected) in literals and (case.args is None or re.sub(r"\s+", " ", case.args) in flat)
    ]
    if len(hits) >= 2 and len(hits) >= 0.6 * len(cases):
        return hits
    if len(cases) == 1 and hits and isinstance(hits[0].expected, list | tuple):
        return hits  # one visible case (a tool's whole output), held verbatim as a list
    return None


def from_content(steps: pl.DataFrame, ctx: dict[str, SessionContext], config: QualityConfig) -> list[Hit]:
    hits: list[Hit] = []
    # Only actions that can carry file content or show a test's assertions are parsed in Python.
    text = pl.col("command").fill_null("")
    writes = text.str.contains("<<", literal=True)
    if "arguments" in steps.columns:
        writes = writes | pl.col("arguments").fill_null("").str.contains('"(?:' + "|".join(CONTENT_KEYS) + ')"')
    expected = _expected_cases(
        steps.filter(pl.col("output").fill_null("").str.contains("assert", literal=True) & text.str.contains("test"))
        if "output" in steps.columns
        else steps
    )
    for sid, event, path, content in _written(steps.filter(writes), ctx):
        session = ctx.get(sid) or SessionContext()
        rel = workspace_relative(path, session.root)
        in_deliverable = rel is not None and rel in session.deliverable
        reason = forges(content, config, in_deliverable)
        if reason:
            hits.append(Hit(sid, "forged_verdict", event, path, reason=reason, confirmed=in_deliverable))
        if rel is not None and is_framework(rel):
            hits.append(Hit(sid, "test_framework_patch", event, path, reason=f"writes {rel}", confirmed=in_deliverable))
        elif in_deliverable and MONKEYPATCH.search(content):
            hits.append(
                Hit(
                    sid,
                    "test_framework_patch",
                    event,
                    path,
                    reason="monkeypatches assertion machinery",
                    confirmed=in_deliverable,
                )
            )
        cases = expected.get(sid)
        if cases and in_deliverable:
            table = _hardcoded(cases, content)
            if table:
                shown = ", ".join(repr(c.expected)[:40] for c in table[:3])
                reason = f"answers {len(table)} of the {len(cases)} visible test cases verbatim: {shown}"
                hits.append(Hit(sid, "hardcoded_outputs", event, path, weight=0.8, reason=reason))
    return hits
