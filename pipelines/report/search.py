"""The report's session index: every session in scope, searchable and filterable on the overview page.

The overview cannot list a large lakehouse's sessions in its HTML, nor can every session have a
page, so the index is written beside the pages as shards, ``sessions/index-00000.js`` … of
:data:`pipelines.report.data.INDEX_SHARD` sessions each, flagged sessions first. Each shard is one
call, ``trajlakeIndex(n, rows)``, with rows as JSON arrays (ASCII only: every other character is a
JSON escape). ``sessions/search.js`` loads the shards one after the other from the report's own
directory (the page's Content-Security-Policy allows scripts from there and nowhere else, and no
network at all) and filters as they arrive: free text over the id, task, family, agent, flags and
evidence; task family, outcome, origin, agent and flag as drop-downs. A result links to the
session's page, or, for a session without one, shows the ``trajlake show`` command that prints it;
a flagged session's evidence lines are in its result row, visible without a click.

The script builds every element with ``textContent`` and attributes, never markup, so an id or
evidence line stays text.
"""

from __future__ import annotations

import json
from typing import Any

from common.text import printable
from pipelines.report.inspect import evidence_lines

#: The order of a row's fields in a shard (``search.js`` reads them by position).
ROW_FIELDS = (
    "session_id",
    "page",
    "task_id",
    "family",
    "outcome",
    "origin",
    "agent",
    "status",
    "quality",
    "exportable",
    "cost_usd",
    "started_at",
    "flags",
    "evidence",
)


def _flag_evidence(flags: list[dict[str, Any]] | None) -> tuple[list[str], list[str]]:
    """The flags' names and their evidence as plain lines (``name: kind text``), all of them."""
    names: list[str] = []
    lines: list[str] = []
    for flag in flags or []:
        names.append(str(flag["flag"]))
        for line in evidence_lines(flag):
            label = "$" if line.kind == "command" else line.kind
            lines.append(f"{flag['flag']}: {label} {line.text}")
    return names, lines


def shard_rows(rows: list[dict[str, Any]], page_of: dict[str, str]) -> list[list[Any]]:
    """``rows`` of :func:`pipelines.report.data.session_index` as shard arrays (:data:`ROW_FIELDS`), text made
    printable (:func:`common.text.printable`, one line)."""
    out = []
    for row in rows:
        names, lines = _flag_evidence(row.get("flags"))
        quality = row.get("quality")
        cost = row.get("cost_usd")
        out.append(
            [
                printable(row["session_id"], multiline=False),
                page_of.get(str(row["session_id"])),
                printable(row.get("task_id"), multiline=False),
                printable(row.get("family"), multiline=False),
                printable(row.get("outcome"), multiline=False),
                printable(row.get("origin"), multiline=False) if row.get("origin") is not None else None,
                printable(row.get("agent"), multiline=False),
                printable(row.get("status"), multiline=False),
                None if quality is None else round(float(quality), 4),
                row.get("exportable"),
                None if cost is None else round(float(cost), 6),
                None if row.get("started_at") is None else str(row["started_at"])[:19],
                [printable(n, multiline=False) for n in names],
                [printable(line, multiline=False) for line in lines],
            ]
        )
    return out


def shard_text(number: int, rows: list[list[Any]]) -> str:
    """One shard file's text: ``trajlakeIndex(number, rows);`` with the rows as ASCII-only JSON."""
    return f"trajlakeIndex({number}, {json.dumps(rows, ensure_ascii=True, separators=(',', ':'))});\n"


#: ``sessions/search.js``: loads the shards, filters, pages through the matches.
SEARCH_JS = r"""'use strict';
(function () {
  var root = document.getElementById('search');
  if (!root) { return; }
  var shards = parseInt(root.getAttribute('data-shards'), 10) || 0;
  var F = {id: 0, page: 1, task: 2, family: 3, outcome: 4, origin: 5, agent: 6, status: 7, quality: 8,
           exportable: 9, cost: 10, started: 11, flags: 12, evidence: 13};
  var rows = [];
  var loaded = 0;
  var PAGE = 100;
  var offset = 0;
  var q = document.getElementById('q');
  var status = document.getElementById('search-status');
  var body = document.querySelector('#results tbody');
  var prev = document.getElementById('prev');
  var next = document.getElementById('next');
  var selects = {};
  ['family', 'outcome', 'origin', 'agent', 'flag'].forEach(function (name) {
    selects[name] = document.getElementById('f-' + name);
  });
  window.trajlakeIndex = function (n, data) {
    for (var i = 0; i < data.length; i++) {
      var r = data[i];
      r.hay = [r[F.id], r[F.task], r[F.family], r[F.agent], r[F.outcome], r[F.origin] || '',
               r[F.flags].join(' '), r[F.evidence].join('\n')].join('\n').toLowerCase();
      rows.push(r);
    }
    loaded += 1;
    if (loaded < shards) { load(loaded); }
    render();
  };
  function load(n) {
    var s = document.createElement('script');
    s.src = 'sessions/index-' + ('0000' + n).slice(-5) + '.js';
    s.onerror = function () { status.textContent = 'the index shard ' + s.src + ' could not be read'; };
    document.body.appendChild(s);
  }
  function matches(r, words, chosen) {
    for (var i = 0; i < words.length; i++) { if (r.hay.indexOf(words[i]) < 0) { return false; } }
    if (chosen.family && r[F.family] !== chosen.family) { return false; }
    if (chosen.outcome && r[F.outcome] !== chosen.outcome) { return false; }
    if (chosen.origin && r[F.origin] !== chosen.origin) { return false; }
    if (chosen.agent && r[F.agent] !== chosen.agent) { return false; }
    if (chosen.flag === '(any flag)' && r[F.flags].length === 0) { return false; }
    if (chosen.flag === '(no flag)' && r[F.flags].length > 0) { return false; }
    if (chosen.flag && chosen.flag.charAt(0) !== '(' && r[F.flags].indexOf(chosen.flag) < 0) { return false; }
    return true;
  }
  function cell(tr, text, cls) {
    var td = document.createElement('td');
    if (cls) { td.className = cls; }
    td.textContent = text === null || text === undefined ? '\u2013' : String(text);
    tr.appendChild(td);
    return td;
  }
  function render() {
    var words = q.value.toLowerCase().split(/\s+/).filter(Boolean);
    var chosen = {};
    Object.keys(selects).forEach(function (k) { chosen[k] = selects[k] ? selects[k].value : ''; });
    var found = [];
    for (var i = 0; i < rows.length; i++) { if (matches(rows[i], words, chosen)) { found.push(rows[i]); } }
    if (offset >= found.length) { offset = Math.max(0, found.length - (found.length % PAGE || PAGE)); }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var shown = found.slice(offset, offset + PAGE);
    shown.forEach(function (r) {
      var tr = document.createElement('tr');
      tr.className = r[F.flags].length ? 'result flagged' : 'result';
      var first = cell(tr, '');
      if (r[F.page]) {
        var a = document.createElement('a');
        a.className = 'session';
        a.href = 'sessions/' + r[F.page];
        a.textContent = r[F.id];
        first.appendChild(a);
      } else {
        var code = document.createElement('code');
        code.textContent = r[F.id];
        first.appendChild(code);
        var hint = document.createElement('div');
        hint.className = 'dim';
        hint.textContent = 'no page in this report: trajlake show ' + r[F.id];
        first.appendChild(hint);
      }
      cell(tr, r[F.family]);
      cell(tr, r[F.outcome]);
      cell(tr, r[F.origin]);
      cell(tr, r[F.agent]);
      cell(tr, r[F.quality], 'n');
      var ev = cell(tr, '');
      r[F.evidence].forEach(function (line) {
        var div = document.createElement('div');
        div.className = 'evidence-line';
        div.textContent = line;
        ev.appendChild(div);
      });
      if (!r[F.evidence].length && r[F.flags].length) { ev.textContent = r[F.flags].join(', '); }
      body.appendChild(tr);
    });
    var total = parseInt(root.getAttribute('data-total'), 10) || rows.length;
    status.textContent = found.length + ' of ' + rows.length + ' sessions match' +
      (found.length ? '; showing ' + (offset + 1) + '\u2013' + (offset + shown.length) : '') +
      (loaded < shards ? ' (reading the index: ' + rows.length + ' of ' + total + ' sessions)' : '');
    prev.disabled = offset === 0;
    next.disabled = offset + PAGE >= found.length;
  }
  function restart() { offset = 0; render(); }
  q.addEventListener('input', restart);
  Object.keys(selects).forEach(function (k) { if (selects[k]) { selects[k].addEventListener('change', restart); } });
  prev.addEventListener('click', function () { offset = Math.max(0, offset - PAGE); render(); });
  next.addEventListener('click', function () { offset += PAGE; render(); });
  root.hidden = false;
  var fallback = document.getElementById('search-noscript');
  if (fallback) { fallback.hidden = true; }
  if (shards > 0) { load(0); } else { render(); }
})();
"""


__all__ = ["ROW_FIELDS", "SEARCH_JS", "shard_rows", "shard_text"]
