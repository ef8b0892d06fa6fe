"""``detect_cheats``: every detector over one batch of sessions, grouped into flags with evidence."""

from __future__ import annotations

import json
from collections.abc import Iterable

import polars as pl
from polars._typing import PolarsDataType

from quality.cheats.commands import command_context, from_commands
from quality.cheats.evaluator import from_evaluation, from_submission
from quality.cheats.evidence import CONTENT_KEYS, FLAGS_SCHEMA, Hit, SessionContext, session_contexts
from quality.cheats.filesystem import from_file_ops
from quality.cheats.host import HOST_EXIT_FLAGS, from_host
from quality.cheats.network import from_network
from quality.cheats.outputs import from_content
from quality.config import QualityConfig


def detect_cheats(
    steps: pl.DataFrame,
    file_ops: pl.DataFrame,
    network: pl.DataFrame,
    sessions: pl.DataFrame | None = None,
    config: QualityConfig | None = None,
) -> pl.DataFrame:
    """Cheat flags per session, each backed by evidence of an effect.

    Args:
        steps: columns :data:`STEP_COLUMNS`, optionally ``arguments``, ``exit_code``, ``output``.
        file_ops: columns :data:`FILE_OP_COLUMNS` (``file_op`` events), optionally ``seq``.
        network: columns :data:`NETWORK_COLUMNS` (``network_request`` events).
        sessions: per-session context, columns from :data:`SESSION_COLUMNS` (workspace root,
            egress allowlist, history policy, imported submission, the evaluation's event id and details).
        config: governance table, evaluator paths and result markers.

    Returns:
        One row per (session, flag): :data:`FLAGS_SCHEMA`; ``evidence`` is JSON with
        ``event_ids``, ``paths``, ``commands``, ``hosts``, ``reasons``; ``score`` is the detector's confidence.
    """
    config = config or QualityConfig()
    key: PolarsDataType = steps.schema.get("session_id", pl.Utf8)
    ctx = _contexts(steps, file_ops, network, sessions, key)
    hits = [
        *from_file_ops(file_ops, ctx, config),
        *from_network(network, ctx),
        *from_commands(steps, ctx, config, command_context(sessions, key)),
        *from_content(steps, ctx, config),
        *from_submission(ctx, config),
        *from_evaluation(ctx),
        *from_host(ctx),
    ]
    if not hits:
        return pl.DataFrame(schema=FLAGS_SCHEMA)
    return _flags(hits, config, key)


def _contexts(
    steps: pl.DataFrame,
    file_ops: pl.DataFrame,
    network: pl.DataFrame,
    sessions: pl.DataFrame | None,
    key: PolarsDataType,
) -> dict[str, SessionContext]:
    """Per-row Python context only for sessions some detector reads it for: with file or network
    events, written content or shown assertions, a submission, an evaluation, a declared history."""
    if sessions is None or sessions.is_empty():
        return {}
    text = pl.col("command").fill_null("")
    interesting = text.str.contains("<<", literal=True)
    if "arguments" in steps.columns:
        interesting = interesting | pl.col("arguments").fill_null("").str.contains(
            '"(?:' + "|".join(CONTENT_KEYS) + ')"'
        )
    if "output" in steps.columns:
        interesting = interesting | pl.col("output").fill_null("").str.contains("assert", literal=True)
    needed = pl.concat(
        [
            steps.filter(interesting).select(pl.col("session_id").cast(key)),
            file_ops.select(pl.col("session_id").cast(key)),
            network.select(pl.col("session_id").cast(key)),
            sessions.filter(
                pl.any_horizontal(
                    pl.col(c).is_not_null()
                    for c in ("submission", "eval_details", "history_commit", "protected_files", "deliverables")
                    if c in sessions.columns
                )
                if any(c in sessions.columns for c in ("submission", "eval_details", "history_commit"))
                else pl.lit(False)
            ).select(pl.col("session_id").cast(key)),
            sessions.filter(pl.col("exit_reason").is_in(list(HOST_EXIT_FLAGS))).select(pl.col("session_id").cast(key))
            if "exit_reason" in sessions.columns
            else sessions.clear().select(pl.col("session_id").cast(key)),
        ]
    ).unique()
    return session_contexts(
        sessions.with_columns(pl.col("session_id").cast(key)).join(needed, on="session_id", how="semi")
    )


def _uniq(values: Iterable[str | None]) -> list[str]:
    """The distinct non-empty values, sorted, at most 20."""
    return sorted({v for v in values if v})[:20]


def _flags(hits: list[Hit], config: QualityConfig, key: PolarsDataType) -> pl.DataFrame:
    """The detectors' hits grouped into one flag row per (session, flag): the governance table's class and
    severity, the evidence of every hit, the strongest hit's weight, confirmed when any hit is."""
    policies = config.policies()
    grouped: dict[tuple[str, str], list[Hit]] = {}
    for hit in hits:
        grouped.setdefault((hit.session_id, hit.flag), []).append(hit)
    rows = []
    for (sid, flag), group in sorted(grouped.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        policy = policies[flag]
        evidence = {
            "event_ids": _uniq(h.event_id for h in group),
            "paths": _uniq(h.path for h in group),
            "commands": _uniq(h.command for h in group),
            "hosts": _uniq(h.host for h in group),
            "reasons": _uniq(h.reason for h in group),
        }
        rows.append(
            {
                "session_id": sid,
                "flag": flag,
                "flag_class": policy.flag_class,
                "severity": policy.severity,
                "evidence": json.dumps(evidence, sort_keys=True),
                "score": max(h.weight for h in group),
                "confirmed": any(h.confirmed for h in group),
            }
        )
    frame = pl.DataFrame(rows, schema={**FLAGS_SCHEMA, "session_id": key})
    return frame.sort("session_id", "flag")
