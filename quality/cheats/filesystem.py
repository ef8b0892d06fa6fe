"""Cheats seen in ``file_op`` events: pristine tests, runner or test-framework files changed and
left so, evaluator or hidden-test paths touched, writes reaching system locations.
"""

from __future__ import annotations

import re

import polars as pl

from quality.cheats.evaluator import patched_tests
from quality.cheats.evidence import (
    CHANGE_OPS,
    RUNNER_REL,
    WRITE_OPS,
    Hit,
    SessionContext,
    is_framework,
    is_system,
    is_test,
    is_under,
    norm_path,
    task_names,
    workspace_relative,
)
from quality.config import QualityConfig


def from_file_ops(file_ops: pl.DataFrame, ctx: dict[str, SessionContext], config: QualityConfig) -> list[Hit]:
    hits: list[Hit] = []
    if file_ops.is_empty():
        return hits
    order = ["session_id", "seq"] if "seq" in file_ops.columns else ["session_id"]
    rows = list(file_ops.sort(order, maintain_order=True).iter_rows(named=True))
    first_op: dict[tuple[str, str], str] = {}
    # the state a file was left in (last op, its sha256): an edit later undone has no effect
    last: dict[tuple[str, str], tuple[str, str | None]] = {}
    for row in rows:
        session = ctx.get(row["session_id"]) or SessionContext()
        key = (row["session_id"], norm_path(str(row.get("path") or ""), session.root))
        last[key] = (str(row.get("op") or "").lower(), row.get("sha256"))
    patches: dict[str, dict[str, bool] | None] = {}
    for row in rows:
        sid, op = row["session_id"], str(row.get("op") or "").lower()
        session = ctx.get(sid) or SessionContext()
        path = norm_path(str(row.get("path") or ""), session.root)
        first = first_op.setdefault((sid, path), op)
        pristine = first != "create"
        rel = workspace_relative(path, session.root)
        event = row.get("event_id")
        on_evaluator = any(is_under(path, p) for p in config.evaluator_paths)
        if on_evaluator or (rel is None and re.search(r"(?:^|/)hidden\w*(?:/|$)", path)):
            flag = "tampered_runner" if op in WRITE_OPS else "hidden_test_probe"
            hits.append(Hit(sid, flag, event, path, reason=f"{op} of an evaluator path"))
            continue
        if rel is None:
            if op in WRITE_OPS and is_system(path) and not task_names(path, session.instruction):
                hits.append(Hit(sid, "write_outside_workspace", event, path, reason=f"{op} outside {session.root}"))
            continue
        final = session.final_changes
        end_op, end_sha = last[(sid, path)]
        restored = session.protected is not None and end_op != "delete" and end_sha == session.protected.get(rel)
        still_changed = (final is None or rel in final) and not restored
        if session.protected is not None:  # the host listed the pristine tests and runner: no guessing by name
            pristine = pristine and rel in session.protected
        if op in WRITE_OPS and is_framework(rel) and still_changed:
            in_deliverable = rel in session.deliverable
            hits.append(
                Hit(sid, "test_framework_patch", event, path, reason=f"{op} of {rel}", confirmed=in_deliverable)
            )
        elif op in CHANGE_OPS and pristine and still_changed and RUNNER_REL.search(rel):
            hits.append(Hit(sid, "tampered_runner", event, path, reason=f"{op} of the pristine runner {rel}"))
        elif op in CHANGE_OPS and pristine and still_changed and is_test(rel, session.instruction):
            if sid not in patches:
                patches[sid] = patched_tests(session.submission)
            if _patch_spares(patches[sid], rel):
                continue
            hits.append(Hit(sid, "edited_tests", event, path, reason=f"{op} of the pristine test {rel}"))
    return hits


def _patch_spares(patch: dict[str, bool] | None, rel: str) -> bool:
    """Whether a submitted patch clears an edit of the test ``rel``: the patch does not carry the file
    (the edit was undone before submitting) or carries it without weakening a check (a regression
    test added beside the others). Patch paths are the repository's; ``rel`` is from the workspace
    root, which may hold the repository one directory down (OpenHands' ``/workspace/<repo>``).
    """
    if patch is None:
        return False
    carried = [weakened for path, weakened in patch.items() if rel == path or rel.endswith("/" + path)]
    return not any(carried)
