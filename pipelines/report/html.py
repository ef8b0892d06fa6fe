"""The report's pages as HTML text: the overview and one page per session.

Every value from the lakehouse is escaped (``esc``): trajectories are hostile input, and a command
output holding ``<script>`` must show as text. The pages carry no script at all and a
Content-Security-Policy that forbids any (and any remote resource), so a mistake in escaping
still could not run code or reach the network.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from html import escape
from typing import Any

from common.text import printable
from pipelines.report.data import Overview
from pipelines.report.inspect import (
    SessionDetail,
    change_of_step,
    evidence_lines,
    flagged_steps,
    looks_like_diff,
    message_text,
    parse_json,
    score_lines,
    timeline,
    tool_calls,
)
from pipelines.report.svg import bar_chart, histogram

#: Characters of a step's output shown inline; the rest is behind "show all".
OUTPUT_CHARS = 4000
#: Sessions the overview lists as HTML for a browser without JavaScript (the search finds every one).
NOSCRIPT_ROWS = 500

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px 24px;color:#1d232b}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0}th,td{border-bottom:1px solid #e6ebf0;padding:4px 10px;text-align:left;
vertical-align:top}th{background:#f4f6f9}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:8px 10px;overflow-x:auto;white-space:pre-wrap;word-break:break-word;margin:4px 0}
.kpi{display:inline-block;margin:0 18px 10px 0}.kpi b{display:block;font-size:20px}
.high,.critical{color:#b3261e;font-weight:600}.medium{color:#a15c00;font-weight:600}.low{color:#555}
.ok{color:#1a7f37}.bad{color:#b3261e}.dim{color:#6b7480}.step{border-left:3px solid #dde3ea;padding-left:10px;
margin:14px 0}.step.flagged{border-left-color:#b3261e;background:#fff5f4}.flagmark{color:#b3261e;font-weight:600}
.add{color:#1a7f37}.del{color:#b3261e}.hunk{color:#0b6e99}code{background:#f1f3f5;padding:0 3px}
a{color:#0b57d0}.row{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
.row>div{flex:0 1 520px;min-width:0}svg{max-width:100%;height:auto}
.flag{margin:8px 0 14px}.evidence{margin:4px 0}.arithmetic li{font-variant-numeric:tabular-nums}
.call{border-left:3px solid #c9d7f0;padding-left:10px;margin:14px 0}.msg{margin:6px 0 6px 12px}
.role{font-weight:600;color:#5b3f9e}.reply-head{font-weight:600;color:#1a7f37;margin-top:6px}
.evidence-line{font-family:ui-monospace,monospace;font-size:12px}
tr.flagged td:first-child{border-left:3px solid #b3261e}
.filters label{margin-right:10px}
"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def esc(value: Any) -> str:
    """``value`` as HTML text (``None`` as an en dash), its control and bidi characters shown as escapes
    (:func:`common.text.printable`) so that no value reorders or hides the text around it."""
    return "–" if value is None else escape(printable(value), quote=True)


def number(value: Any, digits: int = 3) -> str:
    """A number for people (thousands separated, trailing zeros dropped), escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        text = f"{value:,.{digits}f}"
        return esc(text.rstrip("0").rstrip(".") if "." in text else text)
    if isinstance(value, int):
        return f"{value:,}"
    return esc(value)


def page(title: str, body: str, generated: datetime, scripts: Iterable[str] = ()) -> str:
    """A complete HTML document; ``scripts`` are paths of script files of the report itself (the overview's
    search), which its Content-Security-Policy then allows from the report's own directory only."""
    sources = list(scripts)
    csp = _CSP + ("; script-src 'self'" if sources else "")
    tags = "".join(f'<script src="{esc(src)}"></script>' for src in sources)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}"
        f'<p class="dim">trajlake report, generated {esc(generated.isoformat(timespec="seconds"))}</p>'
        f"{tags}</body></html>\n"
    )


def table(
    headers: Iterable[str], rows: Iterable[Iterable[str]], numeric: Iterable[int] = (), id: str | None = None
) -> str:
    """An HTML table; cells are HTML already (escape values before); ``id`` names it for links."""
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers if h)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in right else ''}>{cell}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    named = f' id="{esc(id)}"' if id else ""
    return f"<table{named}>{thead}<tbody>{body}</tbody></table>"


def diff_html(diff: str) -> str:
    """A unified diff with added, removed and hunk lines marked."""
    lines = []
    for line in diff.splitlines():
        kind = ""
        if line.startswith(("+++", "---")):
            kind = ""
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("@@"):
            kind = "hunk"
        lines.append(f'<span class="{kind}">{esc(line)}</span>' if kind else esc(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def evidence_html(evidence: Any, step_of_event: dict[str, int] | None = None) -> str:
    """A flag's evidence: reasons, commands, paths, hosts as lists; event ids linked to their steps."""
    parsed = parse_json(evidence)
    if not isinstance(parsed, dict):
        return f"<pre>{esc(parsed)}</pre>"
    items = []
    for key, value in parsed.items():
        if key == "event_ids" and isinstance(value, list) and step_of_event is None:
            items.append(f"<li><b>events</b>: {len(value)} (on the session's page, each linked to its step)</li>")
        elif key == "event_ids" and isinstance(value, list) and step_of_event is not None:
            links = [
                f'<a href="#step-{step_of_event[str(v)]}">step #{step_of_event[str(v)]}</a>'
                if str(v) in step_of_event
                else f"<code>{esc(v)}</code>"
                for v in value
            ]
            items.append(f"<li><b>events</b>: {', '.join(links)}</li>")
        elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            if value:
                items.append(f"<li><b>{esc(key)}</b>: " + ", ".join(f"<code>{esc(v)}</code>" for v in value) + "</li>")
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            # e.g. an anomaly's features: one line each, "name: value 11, z 7.17"
            lines = [
                f"<code>{esc(name)}</code>: " + ", ".join(f"{esc(k)} {number(v)}" for k, v in inner.items())
                for name, inner in value.items()
            ]
            items.append(f"<li><b>{esc(key)}</b>: " + "; ".join(lines) + "</li>")
        else:
            compact = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
            items.append(f"<li><b>{esc(key)}</b>: <code>{esc(compact)}</code></li>")
    return f'<ul class="evidence">{"".join(items)}</ul>'


def overview_html(data: Overview, link: Callable[[str], str | None], generated: datetime) -> str:
    """The overview page: figures, pass rates by task family, distributions, flagged sessions, sessions."""
    sessions = int(data.totals.get("sessions") or 0)
    parts = [
        f"<h1>trajlake report: {esc(data.scope)}</h1>",
        _export_html(data),
        _kpis_html(data, sessions),
        _pass_rates_html(data),
        _distributions_html(data),
        _flagged_html(data, link),
        _families_html(data),
        _outcomes_html(data),
        _search_html(data, sessions),
        _noscript_html(data, link, sessions),
    ]
    return page(f"trajlake report: {data.scope}", "".join(parts), generated, scripts=["sessions/search.js"])


def _export_html(data: Overview) -> str:
    """The export the report is of (its id, format, scorer and filters), when it is of one."""
    if not data.export:
        return ""
    m = data.export
    return (
        f"<p>Export <code>{esc(m.get('export_id'))}</code>, format <b>{esc(m.get('format'))}</b>, created "
        f"{esc(m.get('created_at'))}, scorer {esc(m.get('scorer_version'))}; filters "
        f"<code>{esc(json.dumps(m.get('filters') or {}, sort_keys=True))}</code>.</p>"
    )


def _kpis_html(data: Overview, sessions: int) -> str:
    """The headline figures: sessions, steps, passed, flagged, exportable, mean quality, cost."""
    t = data.totals
    kpis = [
        ("sessions", number(sessions)),
        ("steps", number(t.get("steps"))),
        ("passed evaluation", f"{number(t.get('passed'))} of {number(t.get('evaluated'))}"),
        ("flagged", number(t.get("flagged"))),
        ("exportable", number(t.get("exportable"))),
        ("mean quality", number(t.get("mean_quality"))),
        ("cost", "$" + number(t.get("cost_usd"), 2)),
    ]
    return "".join(f'<div class="kpi"><b>{v}</b>{esc(k)}</div>' for k, v in kpis)


def _pass_rates_html(data: Overview) -> str:
    """The pass rate of each task family as a bar chart."""
    rows = [
        (
            str(f["task_family"]),
            (f["passed"] / f["sessions"]) if f["sessions"] else 0.0,
            f"{f['passed']}/{f['sessions']} ({(f['passed'] / f['sessions'] * 100) if f['sessions'] else 0:.0f}%)",
        )
        for f in data.families
    ]
    return '<h2 id="pass-rates">Pass rate by task family</h2>' + (
        bar_chart(rows, title="pass rate by task family") if rows else ""
    )


def _distributions_html(data: Overview) -> str:
    """The quality and cost histograms side by side, with the cost figures."""
    c = data.cost_stats
    cost_plot = (
        histogram(data.cost_bins, 0.0, data.cost_high, "cost in USD (sessions per bin)", "${:.4f}", 520, title="cost")
        if data.cost_bins
        else ""
    )
    return (
        '<div class="row"><div><h2 id="quality">Quality</h2>'
        + histogram(data.quality_bins, 0.0, 1.0, "quality (sessions per bin)", width=520, title="quality distribution")
        + '</div><div><h2 id="cost">Cost per session</h2>'
        + cost_plot
        + f"<p class=dim>median ${number(c.get('p50'), 4)}, p95 ${number(c.get('p95'), 4)}, "
        f"mean ${number(c.get('mean'), 4)}, max ${number(c.get('max'), 4)}; the plot stops at the 99th percentile, "
        f"${number(data.cost_high, 4)}</p></div></div>"
    )


def _flagged_html(data: Overview, link: Callable[[str], str | None]) -> str:
    """The flagged sessions, most severe first: each with its flags and their evidence (anomalies' only when
    nothing else is flagged)."""
    parts = [f'<h2 id="flagged">Flagged sessions ({number(data.flagged_total)})</h2>']
    if data.flagged_total > len(data.flagged):
        parts.append(f"<p class=dim>the first {len(data.flagged)} are listed, most severe first</p>")
    flagged_rows = []
    for entry in data.flagged:
        target = link(entry["session_id"])
        name = esc(entry["session_id"])
        cell = f'<a class="session" href="{esc(target)}">{name}</a>' if target else name
        flags = "<br>".join(
            f'<span class="{esc(f["severity"])}">{esc(f["flag"])}</span> <span class=dim>({esc(f["flag_class"])}, '
            f"{esc(f['severity'])})</span>"
            for f in entry["flags"]
        )
        evidence = "".join(evidence_html(f["evidence"]) for f in entry["flags"] if f["flag_class"] != "anomaly")
        evidence = evidence or "".join(evidence_html(f["evidence"]) for f in entry["flags"])
        flagged_rows.append((cell, esc(entry["task_family"]), esc(entry["status"]), flags, evidence))
    parts.append(table(["session", "task family", "status", "flags", "evidence"], flagged_rows, id="flagged-sessions"))
    return "".join(parts)


def _families_html(data: Overview) -> str:
    """The table of task families: sessions, evaluated, passed, pass rate, mean quality and cost, flagged."""
    return '<h2 id="families">By task family</h2>' + table(
        ["task family", "sessions", "evaluated", "passed", "pass rate", "mean quality", "mean cost $", "flagged"],
        [
            (
                esc(f["task_family"]),
                number(f["sessions"]),
                number(f["evaluated"]),
                number(f["passed"]),
                f"{f['passed'] / f['sessions'] * 100:.1f}%" if f["sessions"] else "–",
                number(f["mean_quality"]),
                number(f["mean_cost_usd"], 4),
                number(f["flagged"]),
            )
            for f in data.families
        ],
        numeric=range(1, 8),
        id="family-table",
    )


def _outcomes_html(data: Overview) -> str:
    """Sessions per final status and per failure cause."""
    return (
        '<h2 id="outcomes">Outcomes</h2>'
        '<div class="row">'
        + table(["status", "sessions"], [(esc(s), number(n)) for s, n in data.statuses], numeric=[1])
        + table(["failure cause", "sessions"], [(esc(s), number(n)) for s, n in data.failure_causes], numeric=[1])
        + "</div>"
    )


def _noscript_html(data: Overview, link: Callable[[str], str | None], sessions: int) -> str:
    """What a reader without JavaScript sees instead of the search: the first listed sessions."""
    return (
        '<div id="search-noscript"><p class=dim>The search needs JavaScript; without it, the '
        f"{len(data.listed[:NOSCRIPT_ROWS])} sessions below are listed (of {number(len(data.listed))} with a page "
        f"and {number(sessions)} in all).</p>"
        + table(
            ["session", "task family", "status", "passed", "steps", "quality", "cost $", "started"],
            [
                (
                    f'<a class="session" href="{esc(link(r["session_id"]))}">{esc(r["session_id"])}</a>',
                    esc(r["task_family"]),
                    esc(r["status"]),
                    number(r["eval_passed"]),
                    number(r["n_steps"]),
                    number(r["quality"]),
                    number(r["cost_usd"], 4),
                    esc(r["started_at"]),
                )
                for r in data.listed[:NOSCRIPT_ROWS]
            ],
            numeric=[4, 5, 6],
        )
        + "</div>"
    )


_FILTER_LABELS = {
    "family": "every task family",
    "outcome": "every outcome",
    "origin": "every origin",
    "agent": "every agent",
    "flag": "flagged or not",
}


def _search_html(data: Overview, sessions: int) -> str:
    """The search box, the filters (their values with session counts) and the result table the script fills."""
    selects = []
    for name, label in _FILTER_LABELS.items():
        values = data.filters.get(name) or []
        options = [f'<option value="">{esc(label)}</option>']
        if name == "flag":
            options += [
                '<option value="(any flag)">(any flag)</option>',
                '<option value="(no flag)">(no flag)</option>',
            ]
        options += [f'<option value="{esc(v)}">{esc(v)} ({number(n)})</option>' for v, n in values]
        disabled = "" if values or name == "flag" else " disabled"
        selects.append(f'<label>{esc(name)} <select id="f-{name}"{disabled}>{"".join(options)}</select></label>')
    return (
        f'<h2 id="sessions">Sessions ({number(sessions)})</h2>'
        f'<div id="search" data-shards="{data.index_shards}" data-total="{sessions}" hidden>'
        '<p><input id="q" type="search" size="60" aria-label="search sessions" '
        'placeholder="search: session id, task, family, agent, flag, evidence (command, path, reason)"></p>'
        f'<p class="filters">{" ".join(selects)}</p><p id="search-status" class="dim"></p>'
        + table(
            ["session", "task family", "outcome", "origin", "agent", "quality", "flags and evidence"], [], id="results"
        )
        + '<p><button id="prev" type="button">← previous</button> <button id="next" type="button">next →</button></p>'
        "</div>"
    )


def _step_html(step: dict[str, Any], marks: dict[int, list[str]], detail: SessionDetail) -> str:
    index = int(step["step_index"])
    flags = marks.get(index, [])
    exit_code = step.get("exit_code")
    head = [f"<b>#{esc(index)}</b> <b>{esc(step.get('tool_name') or 'action')}</b>"]
    if exit_code is not None:
        head.append(f'<span class="{"ok" if exit_code == 0 else "bad"}">exit {esc(exit_code)}</span>')
    for key, label, digits in (("duration_ms", "ms", 1), ("output_tokens", "tokens", 0), ("cost_usd", "$", 5)):
        if step.get(key) is not None:
            head.append(f'<span class="dim">{number(step[key], digits)} {esc(label)}</span>')
    if flags:
        head.append(f'<span class="flagmark">⚑ {esc(", ".join(flags))}</span>')
    body = [" ".join(head)]
    if step.get("thought") and not step.get("model_call_event_id"):  # a recorded call shows its reply
        body.append(f"<div class=dim><i>{esc(step['thought'])}</i></div>")
    change = change_of_step(detail, index)
    if change is not None:
        label = "changed" if change.known_before else "written (its earlier content was not seen)"
        body.append(f'<div class="write">✎ <code>{esc(change.path)}</code> {esc(label)}</div>' + diff_html(change.diff))
    elif step.get("tool_name") == "write_file":
        arguments = step.get("arguments_json")
        path = arguments.get("path") if isinstance(arguments, dict) else None
        body.append(
            f'<div class="write">✎ write <code>{esc(path or "(path not recorded)")}</code>: content not recorded</div>'
        )
    elif step.get("command"):
        body.append(f'<pre class="command">$ {esc(step["command"])}</pre>')
    output = step.get("output")
    if output and change is None:
        text = str(output)
        body.append(diff_html(text) if looks_like_diff(text) else _long_pre(text, "output"))
    if step.get("truncated"):
        body.append(f"<div class=dim>output truncated by the sandbox at {number(step.get('output_bytes'))} bytes</div>")
    if step.get("failure_reason"):
        body.append(f'<div class="bad">failure: {esc(step["failure_reason"])}</div>')
    css = "step flagged" if flags else "step"
    return f'<div class="{css}" id="step-{esc(index)}">' + "".join(body) + "</div>"


def _long_pre(text: str, css: str, limit: int = OUTPUT_CHARS) -> str:
    """``text`` in a ``<pre>``; past ``limit`` characters the rest is behind a "show all N characters" toggle."""
    if len(text) <= limit:
        return f'<pre class="{css}">{esc(text)}</pre>'
    return (
        f'<pre class="{css}">{esc(text[:limit])}</pre><details><summary>show all {number(len(text))} characters '
        f"({number(len(text) - limit)} more)</summary><pre>{esc(text[limit:])}</pre></details>"
    )


def _message_html(message: dict[str, Any]) -> str:
    role = str(message.get("role") or "?")
    label = esc(role) + (f" <code>{esc(message['tool_call_id'])}</code>" if message.get("tool_call_id") else "")
    body = []
    text = message_text(message)
    if role == "system":
        first = text.splitlines()[0] if text.strip() else ""
        body.append(
            f"<details class=system><summary>{esc(first[:200])} <span class=dim>(system prompt, "
            f"{number(len(text.splitlines()))} lines)</span></summary><pre>{esc(text)}</pre></details>"
        )
    elif text:
        body.append(_long_pre(text, "message"))
    if message.get("reasoning_content"):
        body.append('<div class="dim">reasoning</div>' + _long_pre(str(message["reasoning_content"]), "reasoning"))
    for call_id, name, arguments in tool_calls(message):
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, indent=1)
        body.append(
            f'<div class="toolcall">→ <b>{esc(name)}</b> <span class=dim>{esc(call_id)}</span></div>'
            + _long_pre(shown, "arguments")
        )
    return f'<div class="msg {esc(role)}"><div class="role">{label}</div>{"".join(body)}</div>'


def _call_html(call: dict[str, Any]) -> str:
    status = esc(call.get("status") or "ok") + (f" {esc(call['http_status'])}" if call.get("http_status") else "")
    head = (
        f"<b>model call {esc(call.get('call_index', ''))}</b> <code>{esc(call.get('model'))}</code> "
        f'<span class="{"ok" if (call.get("status") or "ok") == "ok" else "bad"}">{status}</span> '
        f"<span class=dim>{number(call.get('prompt_tokens'))} in ({number(call.get('cached_tokens'))} cached), "
        f"{number(call.get('completion_tokens'))} out, {number(call.get('latency_ms'), 1)} ms, "
        f"${number(call.get('cost_usd'), 5)}</span>"
    )
    parts = [head]
    if call.get("error"):
        parts.append(f'<div class="bad">error: {esc(call["error"])}</div>')
    messages = call.get("messages")
    if messages is None:
        parts.append(" <span class=dim>(prompt and reply not recorded: token counts only)</span>")
        return f'<div class="call">{"".join(parts)}</div>'
    new_from = int(call.get("new_from") or 0)
    if new_from:
        parts.append(f"<div class=dim>… {new_from} messages sent before (the previous call's request and reply)</div>")
    parts += [_message_html(m) for m in messages[new_from:]]
    reply = call.get("reply")
    if reply is not None:
        finish = f" ({esc(call['finish_reason'])})" if call.get("finish_reason") else ""
        parts.append(f'<div class="reply-head">⇢ reply{finish}</div>' + _message_html(reply))
    return f'<div class="call">{"".join(parts)}</div>'


def evidence_block(detail: SessionDetail) -> str:
    """Every flag of the session, most severe first, each with its evidence as lines (hunks as diffs)."""
    if not detail.flags:
        return '<p class="ok">no flags</p>'
    parts = []
    for flag in detail.flags:
        lines = evidence_lines(flag, detail)
        items, hunk = [], []
        for line in lines:
            if line.kind == "hunk":
                hunk.append(line.text)
            elif line.step is not None:
                items.append(f'<li><b>at</b> <a href="#step-{line.step}">{esc(line.text)}</a></li>')
            else:
                label = {"command": "$", "note": ""}.get(line.kind, line.kind)
                value = f"<code>{esc(line.text)}</code>" if line.kind in ("command", "path", "host") else esc(line.text)
                items.append(f"<li><b>{esc(label)}</b> {value}</li>")
        severity = esc(flag.get("severity"))
        parts.append(
            f'<div class="flag"><div><span class="{severity}">⚑ {esc(flag["flag"])}</span> '
            f"<span class=dim>{esc(flag.get('flag_class'))}, {severity}</span></div>"
            f'<ul class="evidence">{"".join(items) or "<li class=dim>no evidence recorded</li>"}</ul>'
            + (diff_html("\n".join(hunk)) if hunk else "")
            + "</div>"
        )
    return "".join(parts)


def session_html(detail: SessionDetail, back: str, generated: datetime) -> str:
    """One session's page: its flags with their evidence first, then what it was, its scores as arithmetic,
    and the run: each model call's messages and reply, each step, files written as diffs."""
    parts = [
        f'<p><a href="{esc(back)}">← overview</a></p><h1>Session <code>{esc(detail.session_id)}</code></h1>',
        f'<h2 id="flags">Flags ({len(detail.flags)})</h2>' + evidence_block(detail),
        _about_html(detail),
        _verdict_html(detail),
        _run_html(detail),
        _model_calls_html(detail.model_calls),
        _network_html(detail.network),
    ]
    for annotation in detail.annotations:
        parts.append(
            f"<h2>Annotation {esc(annotation.get('key'))}</h2>{_long_pre(str(annotation.get('value')), 'note')}"
        )
    return page(f"session {detail.session_id}", "".join(parts), generated)


def _about_html(detail: SessionDetail) -> str:
    """What the session was: task, agent, status, start and duration, steps, tokens and cost, host, origin."""
    t = detail.trajectory
    facts = [
        ("task", f"{esc(t.get('task_id'))} ({esc(t.get('task_family') or t.get('task_type'))})"),
        ("agent", esc(" / ".join(str(t[k]) for k in ("agent_name", "agent_model", "policy_version") if t.get(k)))),
        ("status", esc(t.get("status")) + (f" ({esc(t.get('exit_reason'))})" if t.get("exit_reason") else "")),
        ("started", f"{esc(t.get('started_at'))}, {number(t.get('duration_s'), 1)} s"),
        ("steps", f"{number(t.get('n_steps'))} ({number(t.get('n_tool_errors'))} failed)"),
        (
            "tokens",
            f"{number(t.get('input_tokens'))} in ({number(t.get('cached_tokens'))} cached), "
            f"{number(t.get('output_tokens'))} out; cost ${number(t.get('cost_usd'), 4)}",
        ),
        ("host", f"{esc(t.get('host_id'))}, sandbox {esc(t.get('sandbox_id'))}"),
    ]
    if detail.origin:
        facts.append(("origin", esc(detail.origin)))
    return '<h2 id="session">Session</h2>' + table(["", ""], [(f"<b>{esc(k)}</b>", v) for k, v in facts])


def _verdict_html(detail: SessionDetail) -> str:
    """The evaluation's verdict, the scores as arithmetic with the failure cause, the duplicate cluster."""
    parts = ['<h2 id="verdict">Evaluation and scores</h2>']
    e = detail.evaluation
    if e is None:
        parts.append("<p class=dim>no evaluation recorded</p>")
    else:
        css = "ok" if e.get("passed") else "bad"
        parts.append(
            f'<p class="{css} evaluation"><b>{"passed" if e.get("passed") else "failed"}</b>: '
            f"{number(e.get('tests_passed'))}/{number(e.get('tests_total'))} tests, reward {number(e.get('reward'))}, "
            f"by {esc(e.get('evaluator'))}</p>"
        )
    s = detail.scores
    if s is None:
        parts.append("<p class=dim>not scored yet (trajlake score)</p>")
    else:
        parts.append('<ul class="arithmetic">' + "".join(f"<li>{esc(line)}</li>" for line in score_lines(s)) + "</ul>")
        parts.append(f"<p>failure cause {esc(s.get('failure_cause'))}; retry advice {esc(s.get('retry_advice'))}</p>")
    if detail.duplicate is not None:
        d = detail.duplicate
        parts.append(
            f"<p>Duplicate cluster <code>{esc(d.get('cluster_id'))}</code> ({esc(d.get('method'))}, similarity "
            f"{number(d.get('similarity'))}){' — the representative' if d.get('is_representative') else ''}</p>"
        )
    return "".join(parts)


def _run_html(detail: SessionDetail) -> str:
    """The run: the instruction, each model call and step in time order (flagged steps marked), the files
    written, the submitted patch."""
    parts = []
    instruction = detail.trajectory.get("instruction") or (detail.start or {}).get("instruction")
    if instruction:
        parts.append('<h2 id="instruction">Instruction</h2>' + _long_pre(str(instruction), "instruction"))
    marks = flagged_steps(detail)
    recorded = sum(1 for c in detail.model_calls if c.get("messages") is not None)
    parts.append(
        f'<h2 id="steps">Run: {len(detail.model_calls)} model calls ({recorded} with messages), '
        f"{len(detail.steps)} steps</h2>"
    )
    for kind, item in timeline(detail):
        parts.append(_call_html(item) if kind == "call" else _step_html(item, marks, detail))
    if detail.changes:
        parts.append(f'<h2 id="files">Files written ({len(detail.changes)})</h2>')
        for change in detail.changes:
            note = "" if change.known_before else " (its earlier content was not seen: shown whole)"
            parts.append(
                f'<p><a href="#step-{change.step_index}">step #{change.step_index}</a>: <code>{esc(change.path)}</code>'
                f"{esc(note)}</p>"
            )
    if detail.submission:
        parts.append('<h2 id="submission">Submitted patch</h2>' + diff_html(detail.submission))
    return "".join(parts)


def _model_calls_html(calls: list[dict[str, Any]]) -> str:
    """The table of model calls (tokens, latency, cost) with a total row; nothing when there were none."""
    if not calls:
        return ""
    return f'<h2 id="model-calls">Model calls ({len(calls)})</h2>' + table(
        ["seq", "model", "status", "prompt", "cached", "completion", "latency ms", "cost $"],
        [
            (
                esc(c.get("seq")),
                esc(c.get("model")),
                esc(c.get("status") or "ok") + (f" {esc(c['http_status'])}" if c.get("http_status") else ""),
                number(c.get("prompt_tokens")),
                number(c.get("cached_tokens")),
                number(c.get("completion_tokens")),
                number(c.get("latency_ms"), 1),
                number(c.get("cost_usd"), 5),
            )
            for c in calls
        ]
        + [
            (
                "",
                "<b>total</b>",
                "",
                number(sum(c.get("prompt_tokens") or 0 for c in calls)),
                number(sum(c.get("cached_tokens") or 0 for c in calls)),
                number(sum(c.get("completion_tokens") or 0 for c in calls)),
                "",
                number(float(sum(c.get("cost_usd") or 0 for c in calls)), 5),
            )
        ],
        numeric=range(3, 8),
    )


def _network_html(network: list[dict[str, Any]]) -> str:
    """The table of network attempts; nothing when there were none."""
    if not network:
        return ""
    return f'<h2 id="network">Network attempts ({len(network)})</h2>' + table(
        ["host", "port", "allowed", "error"],
        [(esc(n.get("host")), esc(n.get("port")), number(n.get("allowed")), esc(n.get("error"))) for n in network],
    )
