"""``trajlake show SESSION``: one run in the terminal, read the way a trace viewer lays it out.

First what matters most: the session in one panel, then every flag with its evidence as lines
(the reason, the command, the path, the step, the diff hunk that wrote the file), then the
evaluation and the scores as arithmetic (weights × components = raw quality, × the governance
weight and the flag that set it = quality, against the threshold, and what decided
exportability). Then the run in the order it happened: each model call with the messages it sent
(the system prompt collapsed to its first line, the messages the previous call had not sent in
order) and its reply (reasoning, text, tool calls as calls), each step with its command and output
— a file write as the file and its diff, not as a shell command — then the files written, the
submitted patch, network attempts and annotations.

Long texts are cut to :data:`OUTPUT_LINES` lines, and every cut says how much it left out and that
``--full`` shows it; nothing is cut silently. On a terminal the output goes through a pager.

Everything printed comes from the trajectory, which is hostile input: it is printed as text,
never as rich markup, and every control character, escape sequence and bidi control goes through
:func:`common.text.printable` so that an output cannot rewrite the terminal.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from common.text import printable
from pipelines.report.inspect import (
    SessionDetail,
    change_of_step,
    evidence_lines,
    flagged_steps,
    looks_like_diff,
    message_text,
    score_lines,
    timeline,
    tool_calls,
)

#: Lines of a command's output, a message or a diff shown before "… N more lines" (``--full`` shows all).
OUTPUT_LINES = 12
#: Characters of one line shown before " … N more characters" (``--full`` shows whole lines).
LINE_CHARS = 400


def clean(value: Any) -> str:
    """``value`` as text with every control character except newline and tab made visible (``\\x1b``)."""
    return printable(value).expandtabs(4)


def _cut(text: str, lines: int | None) -> tuple[str, int]:
    """The first ``lines`` lines of ``text`` (each cut to ``LINE_CHARS``, saying so) and how many were left out."""
    rows = text.splitlines()
    if lines is None:
        return "\n".join(rows), 0
    shown = [
        row if len(row) <= LINE_CHARS else f"{row[:LINE_CHARS]} … ({len(row) - LINE_CHARS:,} more characters)"
        for row in rows[:lines]
    ]
    return "\n".join(shown), max(0, len(rows) - lines)


def cut_text(value: Any, lines: int | None, style: str = "", indent: str = "") -> Text:
    """``value`` cleaned, cut to ``lines`` lines, with a dim line saying how many more ``--full`` shows."""
    shown, more = _cut(clean(value), lines)
    text = Text("\n".join(indent + row for row in shown.splitlines()), style=style)
    if more:
        text.append(f"\n{indent}… {more:,} more lines (--full shows them)", style="dim")
    return text


def diff_text(diff: str, lines: int | None, indent: str = "") -> Text:
    """A unified diff coloured by line kind, cut to ``lines`` lines."""
    shown, more = _cut(clean(diff), lines)
    text = Text()
    for line in shown.splitlines():
        text.append(indent + line + "\n", style=_diff_style(line))
    if more:
        text.append(f"{indent}… {more:,} more lines (--full shows them)\n", style="dim")
    return text


def _diff_style(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "bold"
    if line.startswith("+"):
        return "green"
    if line.startswith("-"):
        return "red"
    if line.startswith("@@"):
        return "cyan"
    return ""


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
    if detail.origin:
        rows.append(("origin", clean(detail.origin)))
    if t.get("group_id") or (t.get("attempt") or 1) > 1:
        rows.append(("group", f"{clean(t.get('group_id'))} attempt {_number(t.get('attempt'))}"))
    for name, value in rows:
        grid.add_row(name, Text(value))
    return Panel(grid, title=Text(f"session {clean(detail.session_id)}"), title_align="left")


_EVIDENCE_LABEL = {
    "reason": "reason",
    "command": "$",
    "path": "path",
    "host": "host",
    "step": "at",
    "feature": "feature",
    "note": "",
}


def flags_block(detail: SessionDetail, lines: int | None) -> Text:
    """Every flag, most severe first, each followed by its evidence as plain lines (hunks as diffs)."""
    if not detail.flags:
        return Text("no flags", style="green")
    text = Text()
    for flag in detail.flags:
        severe = flag.get("severity") in ("high", "critical")
        style = "red" if severe else "yellow"
        text.append("⚑ ", style=f"bold {style}")
        text.append(clean(flag["flag"]), style=f"bold {style}")
        text.append(f"  {clean(flag.get('flag_class'))}, {clean(flag.get('severity'))}\n", style=style)
        evidence = evidence_lines(flag, detail)
        hunk: list[str] = []
        for line in evidence:
            if line.kind == "hunk":
                hunk.append(line.text)
                continue
            label = _EVIDENCE_LABEL.get(line.kind, line.kind)
            text.append(f"    {label + ' ' if label else ''}", style="dim")
            text.append(clean(line.text) + "\n", style="bold" if line.kind == "command" else "")
        if hunk:
            text.append_text(diff_text("\n".join(hunk), None if lines is None else max(lines, 40), indent="    "))
        if not evidence:
            text.append("    (no evidence recorded)\n", style="dim")
    text.rstrip()
    return text


def verdict(detail: SessionDetail) -> Table:
    """Evaluation, the scores as arithmetic and the duplicate cluster."""
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
        table.add_row("scores", Text("\n".join(clean(line) for line in score_lines(scores))))
        table.add_row(
            "failure",
            Text(f"{clean(scores.get('failure_cause'))}; retry: {clean(scores.get('retry_advice'))}"),
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


def _arguments(arguments: Any) -> str:
    """A tool call's arguments as ``name=value`` pairs (values as JSON), or as given when not an object."""
    if isinstance(arguments, dict):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return "" if arguments is None else str(arguments)


def _message_block(message: dict[str, Any], lines: int | None, system_lines: int | None) -> Group:
    """One chat message: its role (and the tool call it answers), text, reasoning and tool calls, indented."""
    role = str(message.get("role") or "?")
    label = role + (f" [{message['tool_call_id']}]" if message.get("tool_call_id") else "")
    body: list[Any] = []
    text = message_text(message)
    if text:
        body.append(cut_text(text, system_lines if role == "system" else lines))
    if message.get("reasoning_content"):
        body.append(Text("reasoning:", style="dim"))
        body.append(cut_text(message["reasoning_content"], lines, style="italic dim"))
    for call_id, name, arguments in tool_calls(message):
        call = Text("→ ", style="bold cyan")
        call.append(clean(name), style="bold cyan")
        call.append_text(cut_text(f"({_arguments(arguments)})", lines))
        if call_id:
            call.append(f"  [{clean(call_id)}]", style="dim")
        body.append(call)
    head = Text(f"  {clean(label)}", style="bold magenta" if role == "system" else "bold")
    return Group(head, Padding(Group(*body), (0, 0, 0, 4), expand=False))


def call_block(call: dict[str, Any], lines: int | None) -> Group:
    """One model call: a header line (model, status, tokens, latency, cost), the messages it sent that the
    previous call had not, and its reply."""
    head = Text()
    head.append(f"model call {_number(call.get('call_index', '')) if 'call_index' in call else ''}".rstrip(), "bold")
    head.append(f"  {clean(call.get('model') or '?')}", style="cyan")
    status = clean(call.get("status") or "ok")
    if call.get("http_status") and status != "ok":
        status += f" {call['http_status']}"
    head.append(f"  {status}", style="red" if status != "ok" else "green")
    head.append(
        f"  {_number(call.get('prompt_tokens'))} in ({_number(call.get('cached_tokens'))} cached), "
        f"{_number(call.get('completion_tokens'))} out",
        style="dim",
    )
    if call.get("latency_ms"):
        head.append(f"  {_number(call['latency_ms'], 1)} ms", style="dim")
    if call.get("cost_usd"):
        head.append(f"  ${_number(call['cost_usd'], 5)}", style="dim")
    parts: list[Any] = [head]
    if call.get("error"):
        parts.append(Text(f"  error: {clean(call['error'])}", style="red"))
    messages = call.get("messages")
    if messages is None:
        head.append("  (prompt and reply not recorded: token counts only)", style="dim")
        return Group(*parts)
    new_from = int(call.get("new_from") or 0)
    system_lines = None if lines is None else 1
    if new_from:
        parts.append(Text(f"  … {new_from} messages sent before (the previous call's request and reply)", "dim"))
    for message in messages[new_from:]:
        parts.append(_message_block(message, lines, system_lines))
    reply = call.get("reply")
    if reply is not None:
        finish = f" ({clean(call['finish_reason'])})" if call.get("finish_reason") else ""
        parts.append(Text(f"  ⇢ reply{finish}", style="bold green"))
        parts.append(_message_block(reply, lines, lines))
    return Group(*parts)


def step_block(
    step: dict[str, Any], marks: dict[int, list[str]], lines: int | None, detail: SessionDetail | None = None
) -> Group:
    """One step: its header line, thought, command and output; a file write as the file and its diff;
    ``marks`` names the flags pointing at it."""
    index = int(step["step_index"])
    flagged = marks.get(index, [])
    exit_code = step.get("exit_code")
    head = Text()
    head.append(f"#{index} ", style="bold")
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
    if step.get("thought") and not step.get("model_call_event_id"):  # a recorded call shows its reply
        parts.append(cut_text(step["thought"], lines and 4, style="italic dim"))
    change = change_of_step(detail, index) if detail is not None else None
    arguments = step.get("arguments_json")
    if change is not None:
        label = "changed" if change.known_before else "written (its earlier content was not seen)"
        parts.append(Text(f"✎ {clean(change.path)} {label}", style="bold"))
        parts.append(diff_text(change.diff, lines))
    elif step.get("tool_name") == "write_file":
        path = arguments.get("path") if isinstance(arguments, dict) else None
        parts.append(Text(f"✎ write {clean(path or '(path not recorded)')}: content not recorded", style="bold"))
    elif step.get("command"):
        parts.append(cut_text("$ " + str(step["command"]), lines and 6, style="bold"))
    output = step.get("output")
    if output and change is None:
        if looks_like_diff(str(output)):
            parts.append(diff_text(str(output), lines))
        else:
            parts.append(cut_text(output, lines))
        if step.get("truncated"):
            parts.append(Text(f"[output truncated by the sandbox at {_number(step.get('output_bytes'))} bytes]"))
    if step.get("failure_reason"):
        parts.append(Text(f"failure: {clean(step['failure_reason'])}", style="red"))
    return Group(*parts)


def model_calls_table(detail: SessionDetail) -> Table:
    """The model calls' totals: model, status, tokens, latency, cost, one row each and a total."""
    table = Table(expand=False)
    for column in ("seq", "model", "status", "prompt", "cached", "completion", "latency ms", "cost $"):
        table.add_column(column, justify="right" if column not in ("model", "status") else "left", overflow="fold")
    calls = detail.model_calls
    for call in calls:
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
    """Print ``detail`` on ``console``; ``full`` prints every message, output, diff and line whole."""
    lines = None if full else OUTPUT_LINES
    console.print(header(detail))
    console.rule(Text(f"flags ({len(detail.flags)}) with their evidence"), align="left")
    console.print(flags_block(detail, lines))
    console.rule(Text("evaluation and scores"), align="left")
    console.print(verdict(detail))
    instruction = detail.trajectory.get("instruction") or (detail.start or {}).get("instruction")
    if instruction:
        console.rule(Text("instruction"), align="left")
        console.print(cut_text(instruction, None if full else 20, style="italic"))
    marks = flagged_steps(detail)
    recorded = sum(1 for c in detail.model_calls if c.get("messages") is not None)
    console.rule(
        Text(f"run: {len(detail.model_calls)} model calls ({recorded} with messages), {len(detail.steps)} steps"),
        align="left",
    )
    for kind, item in timeline(detail):
        console.print(call_block(item, lines) if kind == "call" else step_block(item, marks, lines, detail))
        console.print()
    if detail.changes:
        console.rule(Text(f"files written ({len(detail.changes)})"), align="left")
        for change in detail.changes:
            label = "changed" if change.known_before else "written (content not seen before)"
            console.print(Text(f"step #{change.step_index}: {clean(change.path)} {label}", style="bold"))
    if detail.submission:
        console.rule(Text("submitted patch"), align="left")
        console.print(diff_text(detail.submission, None if full else 40))
    if detail.model_calls:
        console.rule(Text(f"model calls ({len(detail.model_calls)})"), align="left")
        console.print(model_calls_table(detail))
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
        console.print(cut_text(note.get("value"), lines and 30))
