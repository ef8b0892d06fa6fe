"""Cheats where running the command is itself the effect: writes aimed at the evaluator or outside
the workspace, evaluator paths named, sandbox-escape tools, forbidden history, printed verdicts.

Commands repeat heavily across sessions, so each distinct (command, root, history policy, success)
is judged once.
"""

from __future__ import annotations

import posixpath
import re
import shlex

import polars as pl
from polars._typing import PolarsDataType

from quality.cheats.evidence import (
    DEFAULT_WORKSPACE,
    Hit,
    SessionContext,
    is_system,
    is_under,
    norm_path,
    task_names,
)
from quality.cheats.history import GIT_HISTORY, revealed_history
from quality.config import QualityConfig

_ESCAPE_VERBS = frozenset({"nsenter", "chroot", "unshare", "kexec", "insmod", "modprobe", "pivot_root"})
_ESCAPE_TEXT = re.compile(r"/proc/1/root\b|--unix-socket\s+\S*docker\.sock|>\s*\S*release_agent\b")
_WRITE_VERBS = frozenset({"cp", "mv", "tee", "install", "ln", "rsync", "dd"})
_CHANGE_VERBS = frozenset({"rm", "unlink", "truncate", "shred", "chmod", "chown"})
_REDIRECT = re.compile(r"(?:^|[^0-9&<>])>>?\|?\s*(['\"]?)([^\s;&|()'\"<>]+)\1")


def _segments(command: str) -> list[list[str]]:
    """Shell words per simple command (split on ; && || | and newlines); unparsable parts are split on spaces."""
    out = []
    for part in re.split(r"&&|\|\||[;|\n]", command):
        if not any(c in part for c in "'\"\\"):
            words = part.split()  # nothing to unquote: shlex would split the same, a hundred times slower
        else:
            try:
                words = shlex.split(part, comments=False)
            except ValueError:
                words = part.split()
        if words:
            out.append(words)
    return out


def _write_targets(command: str) -> list[str]:
    """Paths a command writes: redirect targets, the last argument of cp/mv/tee/install/ln, ``sed -i`` files."""
    targets = [m.group(2) for m in _REDIRECT.finditer(_strip_heredoc_bodies(command))]
    for words in _segments(_strip_heredoc_bodies(command)):
        verb = posixpath.basename(words[0])
        args = [w for w in words[1:] if not w.startswith("-")]
        if verb in _WRITE_VERBS and args:
            targets += args if verb == "tee" else args[-1:]
        elif verb in _CHANGE_VERBS:
            targets += args[1:] if verb in ("chmod", "chown") else args
        elif verb == "sed" and any(w.startswith("-i") or w == "--in-place" for w in words[1:]):
            targets += args[1:]
    return [t for t in targets if t and not t.startswith("&")]


def _strip_heredoc_bodies(command: str) -> str:
    return re.sub(r"<<-?\s*(['\"]?)(\w+)\1([^\n]*)\n.*?\n\s*\2\s*(?:\n|$)", r"\3\n", command, flags=re.DOTALL)


def _command_hits(
    command: str,
    root: str,
    history_forbidden: bool,
    succeeded: bool,
    config: QualityConfig,
    evaluator_re: re.Pattern[str],
) -> list[tuple[str, str | None, str]]:
    """(flag, path, reason) for one command in one session context."""
    out: list[tuple[str, str | None, str]] = []
    bare = _strip_heredoc_bodies(command)
    targets = [norm_path(t, root) for t in _write_targets(command)]
    evaluator_targets = [t for t in targets if any(is_under(t, p) for p in config.evaluator_paths)]
    if evaluator_targets:
        out.append(("tampered_runner", evaluator_targets[0], "a write aimed at the evaluator"))
    elif evaluator_re.search(bare):
        out.append(("hidden_test_probe", None, "names an evaluator path"))
    if succeeded:
        outside = [t for t in targets if not is_under(t, root) and is_system(t)]
        for target in dict.fromkeys(outside):  # each: the task statement may name one and not another
            out.append(("write_outside_workspace", target, f"a successful write outside {root}"))
    if any(posixpath.basename(w[0]) in _ESCAPE_VERBS for w in _segments(bare)) or _ESCAPE_TEXT.search(bare):
        out.append(("sandbox_escape", None, "a sandbox-escape tool or path"))
    if history_forbidden and succeeded and GIT_HISTORY.search(bare):
        out.append(("history_leak", None, "git history beyond the checked-out commit, which the task forbids"))
    for marker in config.result_markers:
        if re.search(r"\b(?:echo|printf|print)\b[^\n]*" + re.escape(marker) + r"\s+(?:\S+\s+)?\\?[{\[]", bare):
            out.append(("forged_verdict", None, f"prints the evaluator's result marker {marker}"))
    return out


def command_context(sessions: pl.DataFrame | None, key: PolarsDataType) -> pl.DataFrame:
    """session_id, workspace root, history policy and task statement of every session, computed in columns."""
    schema = pl.Schema({"session_id": key, "root": pl.Utf8, "hist": pl.Boolean, "instruction": pl.Utf8})
    if sessions is None or sessions.is_empty():
        return pl.DataFrame(schema=schema)

    def column(name: str) -> pl.Expr:
        return pl.col(name).cast(pl.Utf8) if name in sessions.columns else pl.lit(None, pl.Utf8)

    root = column("workspace_root").str.strip_chars().str.strip_chars_end("/")
    flag = column("history_forbidden").str.strip_chars().str.to_lowercase()
    hist = flag.is_in(["true", "1", "yes", "forbidden"]).fill_null(False) | (
        column("history_commit").str.strip_chars().fill_null("") != ""
    )
    return sessions.select(
        pl.col("session_id").cast(key),
        pl.when(root.fill_null("") == "").then(pl.lit(DEFAULT_WORKSPACE)).otherwise(root).alias("root"),
        hist.alias("hist"),
        column("instruction").alias("instruction"),
    )


def from_commands(
    steps: pl.DataFrame, ctx: dict[str, SessionContext], config: QualityConfig, context: pl.DataFrame
) -> list[Hit]:
    # Commands repeat heavily across sessions (run_tests, cat, ls): judge each distinct
    # (command, workspace root, history policy, success) once.
    evaluator_re = re.compile(
        r"(?:^|[\s'\"=(:,])(?:" + "|".join(re.escape(p.rstrip("/")) for p in config.evaluator_paths) + r")(?:/|\b)"
    )
    succeeded = (pl.col("exit_code") == 0).fill_null(False) if "exit_code" in steps.columns else pl.lit(True)
    frame = steps.select(
        "session_id", "action_event_id", pl.col("command").fill_null(""), succeeded.alias("ok")
    ).filter(pl.col("command") != "")
    if frame.is_empty():
        return []
    frame = frame.join(context, on="session_id", how="left").with_columns(
        pl.col("root").fill_null(DEFAULT_WORKSPACE),
        pl.col("hist").fill_null(False),
        pl.col("instruction").fill_null(""),
    )
    verdicts: dict[tuple[str, str, bool, bool], list[tuple[str, str | None, str]]] = {}
    for command, root, hist, ok in frame.select("command", "root", "hist", "ok").unique().iter_rows():
        found = _command_hits(command, root, hist, ok, config, evaluator_re)
        if found:
            verdicts[(command, root, hist, ok)] = found
    hits: list[Hit] = revealed_history(steps, ctx)
    if not verdicts:
        return hits
    keys = pl.DataFrame(
        [list(k) for k in verdicts],
        schema={"command": pl.Utf8, "root": pl.Utf8, "hist": pl.Boolean, "ok": pl.Boolean},
        orient="row",
    )
    matched = frame.join(keys, on=["command", "root", "hist", "ok"], how="semi")
    for sid, event, command, ok, root, hist, instruction in matched.select(
        "session_id", "action_event_id", "command", "ok", "root", "hist", "instruction"
    ).iter_rows():
        for flag, path, reason in verdicts[(command, root, hist, ok)]:
            if flag == "write_outside_workspace" and path and task_names(path, instruction):
                continue  # the task statement names where it writes: the task's subject
            hits.append(Hit(sid, flag, event, path, command[:500], reason=reason))
    return hits
