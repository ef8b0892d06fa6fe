"""``trajlake show SESSION``: one run in the terminal.

What the agent was asked, what it did step by step (thought, command, output, exit code, tokens,
cost), the files it wrote as diffs, its model calls, the evaluation, the flags with their
evidence (the steps they point at are marked), the scores and its duplicate cluster.

Everything printed comes from the trajectory, which is hostile input: it is printed as text,
never as rich markup, and control characters (terminal escape sequences included) are shown as
visible escapes so that an output cannot rewrite the terminal.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipelines.inspect import SessionDetail, flagged_steps, looks_like_diff

#: Lines of a command's output or a diff shown before "… N more lines" (``--full`` shows all).
OUTPUT_LINES = 12
#: Characters of one line shown before " …" (``--full`` shows whole lines).
LINE_CHARS = 400
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value: Any) -> str:
    """``value`` as text with every control character except newline and tab made visible (``\\x1b``)."""
    text = "" if value is None else str(value)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.expandtabs(4))


def _cut(text: str, lines: int | None) -> tuple[str, int]:
    """The first ``lines`` lines of ``text`` (each cut to ``LINE_CHARS``) and how many lines were left out."""
    rows = text.splitlines()
    if lines is None:
        return "\n".join(rows), 0
    shown = [row if len(row) <= LINE_CHARS else row[:LINE_CHARS] + " …" for row in rows[:lines]]
    return "\n".join(shown), max(0, len(rows) - lines)


def diff_text(diff: str, lines: int | None) -> Text:
    """A unified diff coloured by line kind, cut to ``lines`` lines."""
    shown, more = _cut(clean(diff), lines)
    text = Text()
    for line in shown.splitlines():
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        text.append(line + "\n", style=style)
    if more:
        text.append(f"… {more} more lines (--full shows them)\n", style="dim")
    return text


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return clean(value)


def header(detail: SessionDetail) -> Panel:
    """The session's identity, outcome and totals."""
    t = detail.trajectory
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("task", f"{clean(t.get('task_id'))}  ({clean(t.get('task_family') or t.get('task_type'))})"),
        ("agent", " / ".join(clean(t.get(k)) for k in ("agent_name", "agent_model", "policy_version") if t.get(k))),
        ("status", f"{clean(t.get('status'))}" + (f" ({clean(t.get('exit_reason'))})" if t.get("exit_reason") else "")),
        ("started", f"{clean(t.get('started_at'))}, {_number(t.get('duration_s'), 1)} s"),
        ("steps", f"{_number(t.get('n_steps'))} ({_number(t.get('n_tool_errors'))} failed)"),
        (
            "tokens",
            f"{_number(t.get('input_tokens'))} in ({_number(t.get('cached_tokens'))} cached), "
            f"{_number(t.get('output_tokens'))} out; cost ${_number(t.get('cost_usd'), 4)}",
        ),
        ("host", f"{clean(t.get('host_id'))}  sandbox {clean(t.get('sandbox_id'))}"),
    ]
    if t.get("group_id") or (t.get("attempt") or 1) > 1:
        rows.append(("group", f"{clean(t.get('group_id'))} attempt {_number(t.get('attempt'))}"))
    for name, value in rows:
        grid.add_row(name, Text(value))
    instruction = clean(t.get("instruction") or (detail.start or {}).get("instruction") or "")
    body: list[Any] = [grid]
    if instruction:
        body += [Text(""), Text(_cut(instruction, 8)[0], style="italic")]
    return Panel(Group(*body), title=Text(f"session {clean(detail.session_id)}"), title_align="left")


def verdict(detail: SessionDetail) -> Table:
    """Evaluation, scores and the duplicate cluster, side by side."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    evaluation = detail.evaluation
    if evaluation is None:
        table.add_row("evaluation", Text("none recorded", style="dim"))
    else:
        passed = evaluation.get("passed")
        table.add_row(
            "evaluation",
            Text(
                f"{'passed' if passed else 'failed'}: {_number(evaluation.get('tests_passed'))}/"
                f"{_number(evaluation.get('tests_total'))} tests, reward {_number(evaluation.get('reward'))}, "
                f"by {clean(evaluation.get('evaluator') or 'unknown')}",
                style="green" if passed else "red",
            ),
        )
    scores = detail.scores
    if scores is None:
        table.add_row("scores", Text("not scored yet (trajlake score)", style="dim"))
    else:
        table.add_row(
            "scores",
            Text(
                f"quality {_number(scores.get('quality'))} = completion {_number(scores.get('completion'))}, "
                f"validity {_number(scores.get('validity'))}, novelty {_number(scores.get('novelty'))}"
            ),
        )
        table.add_row(
            "outcome",
            Text(
                f"{clean(scores.get('failure_cause'))}; retry: {clean(scores.get('retry_advice'))}; "
                f"{'exportable' if scores.get('exportable') else 'not exportable'}"
            ),
        )
    if detail.duplicate is not None:
        d = detail.duplicate
        table.add_row(
            "duplicate",
            Text(
                f"cluster {clean(d.get('cluster_id'))} ({clean(d.get('method'))}, similarity "
                f"{_number(d.get('similarity'))}){'; the representative' if d.get('is_representative') else ''}"
            ),
        )
    return table


def flags_table(detail: SessionDetail) -> Table | Text:
    """The flags with their evidence, most severe first."""
    if not detail.flags:
        return Text("no flags", style="green")
    table = Table(show_lines=True, expand=True)
    for column in ("flag", "class", "severity", "evidence"):
        table.add_column(column, overflow="fold")
    for flag in detail.flags:
        evidence = flag.get("evidence_json")
        if isinstance(evidence, dict | list):
            shown = json.dumps(evidence, indent=1, ensure_ascii=False)
        else:
            shown = str(evidence or "")
        style = "red" if flag.get("severity") in ("high", "critical") else "yellow"
        table.add_row(
            Text(clean(flag["flag"]), style=f"bold {style}"),
            Text(clean(flag.get("flag_class"))),
            Text(clean(flag.get("severity")), style=style),
            Text(clean(shown)),
        )
    return table


def step_block(step: dict[str, Any], marks: dict[int, list[str]], lines: int | None) -> Group:
    """One step: its header line, thought, command and output; ``marks`` names the flags pointing at it."""
    flagged = marks.get(int(step["step_index"]), [])
    exit_code = step.get("exit_code")
    head = Text()
    head.append(f"#{step['step_index']} ", style="bold")
    head.append(clean(step.get("tool_name") or "action"), style="bold cyan")
    if exit_code is not None:
        head.append(f"  exit {exit_code}", style="green" if exit_code == 0 else "red")
    if step.get("duration_ms") is not None:
        head.append(f"  {_number(step['duration_ms'], 1)} ms", style="dim")
    if step.get("output_tokens"):
        head.append(f"  {_number(step['output_tokens'])} tokens", style="dim")
    if step.get("cost_usd"):
        head.append(f"  ${_number(step['cost_usd'], 5)}", style="dim")
    if flagged:
        head.append(f"  ⚑ {', '.join(flagged)}", style="bold red")
    parts: list[Any] = [head]
    if step.get("thought"):
        parts.append(Text(_cut(clean(step["thought"]), lines and 4)[0], style="italic dim"))
    command = step.get("command")
    if command:
        parts.append(Text("$ " + _cut(clean(command), lines and 6)[0], style="bold"))
    output = step.get("output")
    if output:
        if looks_like_diff(str(output)):
            parts.append(diff_text(str(output), lines))
        else:
            shown, more = _cut(clean(output), lines)
            text = Text(shown)
            if more:
                text.append(f"\n… {more} more lines (--full shows them)", style="dim")
            if step.get("truncated"):
                text.append(f"\n[output truncated by the sandbox at {_number(step.get('output_bytes'))} bytes]")
            parts.append(text)
    if step.get("failure_reason"):
        parts.append(Text(f"failure: {clean(step['failure_reason'])}", style="red"))
    return Group(*parts)


def model_calls_table(detail: SessionDetail, limit: int | None) -> Table:
    """The model calls: model, status, tokens, latency, cost (``limit`` rows, then a total)."""
    table = Table(expand=False)
    for column in ("seq", "model", "status", "prompt", "cached", "completion", "latency ms", "cost $"):
        table.add_column(column, justify="right" if column not in ("model", "status") else "left")
    calls = detail.model_calls
    for call in calls if limit is None else calls[:limit]:
        status = clean(call.get("status") or "ok")
        if call.get("http_status") and status != "ok":
            status += f" {call['http_status']}"
        table.add_row(
            str(call["seq"]),
            Text(clean(call.get("model") or "")),
            Text(status, style="red" if status != "ok" else ""),
            _number(call.get("prompt_tokens")),
            _number(call.get("cached_tokens")),
            _number(call.get("completion_tokens")),
            _number(call.get("latency_ms"), 1),
            _number(call.get("cost_usd"), 5),
        )
    if limit is not None and len(calls) > limit:
        table.add_row("…", Text(f"{len(calls) - limit} more (--full)"), "", "", "", "", "", "")
    table.add_row(
        "",
        Text("total", style="bold"),
        "",
        _number(sum(c.get("prompt_tokens") or 0 for c in calls)),
        _number(sum(c.get("cached_tokens") or 0 for c in calls)),
        _number(sum(c.get("completion_tokens") or 0 for c in calls)),
        "",
        _number(float(sum(c.get("cost_usd") or 0 for c in calls)), 5),
    )
    return table


def render_session(console: Console, detail: SessionDetail, full: bool = False) -> None:
    """Print ``detail`` on ``console``; ``full`` prints every output, diff and model call whole."""
    lines = None if full else OUTPUT_LINES
    console.print(header(detail))
    console.print(verdict(detail))
    console.rule(Text(f"flags ({len(detail.flags)})"), align="left")
    console.print(flags_table(detail))
    marks = flagged_steps(detail)
    console.rule(Text(f"steps ({len(detail.steps)})"), align="left")
    for step in detail.steps:
        console.print(step_block(step, marks, lines))
        console.print()
    if detail.changes:
        console.rule(Text(f"files written ({len(detail.changes)})"), align="left")
        for change in detail.changes:
            label = "changed" if change.known_before else "written (content not seen before)"
            console.print(Text(f"step #{change.step_index}: {clean(change.path)} {label}", style="bold"))
            console.print(diff_text(change.diff, lines))
    if detail.submission:
        console.rule(Text("submitted patch"), align="left")
        console.print(diff_text(detail.submission, None if full else 40))
    if detail.model_calls:
        console.rule(Text(f"model calls ({len(detail.model_calls)})"), align="left")
        console.print(model_calls_table(detail, None if full else 20))
    if detail.network:
        console.rule(Text(f"network attempts ({len(detail.network)})"), align="left")
        for attempt in detail.network:
            allowed = attempt.get("allowed")
            console.print(
                Text(
                    f"{clean(attempt.get('host'))}:{_number(attempt.get('port'))} "
                    f"{'allowed' if allowed else 'denied'}"
                    + (f" ({clean(attempt['error'])})" if attempt.get("error") else ""),
                    style="" if allowed else "red",
                )
            )
    for note in detail.annotations:
        console.rule(Text(f"annotation {clean(note.get('key'))}"), align="left")
        console.print(Text(_cut(clean(note.get("value")), lines and 30)[0]))
