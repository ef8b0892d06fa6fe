"""Cheats through git history, for sessions that declare it forbidden: commands that show other
commits, and outputs that show the commit holding the answer.
"""

from __future__ import annotations

import re

import polars as pl

from quality.cheats.evidence import Hit, SessionContext

# git commands that show commits other than the checked-out history: every ref, the reflog, dangling objects.
GIT_HISTORY = re.compile(
    r"\bgit\s+(?:-C\s+\S+\s+)?(?:"
    r"log\b[^;&|\n]*\s(?:--all|--branches|--remotes|--tags|--reflog|-g|--walk-reflogs|origin/\S+|refs/\S+)"
    r"|reflog\b|rev-list\b[^;&|\n]*--all|fsck\b[^;&|\n]*(?:--lost-found|--unreachable|--dangling)"
    r"|cat-file\b|show\s+(?!HEAD\b|--stat\s*$)[^\s;&|-][^;&|\n]*|branch\s+(?:-a|-r|--all|--remotes)\b"
    r"|(?:checkout|switch|restore\s+--source(?:=|\s))\s*(?:origin/|refs/|[0-9a-f]{7,40}\b)"
    r"|diff\s+[^;&|\n]*(?:origin/|refs/|[0-9a-f]{7,40}\b))"
)


def revealed_history(steps: pl.DataFrame, ctx: dict[str, SessionContext]) -> list[Hit]:
    """A git command whose output showed the commit that holds the answer (sessions that declare one)."""
    declared = {sid: c.history_commit for sid, c in ctx.items() if c.history_commit and len(c.history_commit) >= 7}
    if not declared or "output" not in steps.columns:
        return []
    hits = []
    candidates = steps.filter(
        pl.col("command").fill_null("").str.contains(r"\bgit\b") & pl.col("output").fill_null("").ne("")
    )
    for row in candidates.iter_rows(named=True):
        commit = declared.get(row["session_id"])
        if commit and commit[:7] in (row.get("output") or ""):
            hits.append(
                Hit(
                    row["session_id"],
                    "history_leak",
                    row.get("action_event_id"),
                    command=(row.get("command") or "")[:500],
                    reason=f"the output shows commit {commit[:12]}, which holds the answer",
                )
            )
    return hits
