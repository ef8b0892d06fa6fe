"""Level 1 of scoring: what can be said about one session from its own events alone.

Scoring has two levels so that it can run incrementally (``pipelines/score/``):

1. **Session facts** (this module): the detectors' flags and their governance, failure cause and
   retry advice, the longest loop, the behaviour features, the exact-duplicate key, the MinHash
   signature and its LSH band keys, tool and exit-code counts. Each depends only on the session
   itself (and the configuration), so a run computes them only for sessions new or changed since
   the last run; they are stored in the ``session_index`` table (the MinHash index).
2. **Combination** (:mod:`quality.combine`): everything that compares a session with others —
   robust z-scores within its profile (origin, task family) and day, novelty against the earlier trajectories of its
   family, quality, duplicate clusters and their representatives, exportability — computed from
   stored facts only, for the sessions whose comparison set changed.

:func:`quality.scoring.score_sessions` is both levels over one set of sessions in memory; the
pipeline computes the same tables piece by piece (a test compares them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from quality.anomalies import FEATURES, profile_key, session_features
from quality.cheats import FLAGS_SCHEMA, detect_cheats
from quality.config import QualityConfig
from quality.dedup import action_tokens, band_keys, build_documents, task_keys, whole_action_tokens
from quality.failure import failure_causes

#: The session facts (``session_index`` rows without the bookkeeping columns).
_FACTS_SCHEMA_TYPES: dict[str, pl.DataType | type[pl.DataType]] = {
    "session_id": pl.Utf8,
    "task_id": pl.Utf8,
    "task_type": pl.Utf8,
    "task_family": pl.Utf8,
    "family": pl.Utf8,  # what novelty compares within: the task family, else the task id
    "origin": pl.Utf8,  # where the session came from (sandbox, synthetic, sdk, import:<format>, otlp)
    "profile": pl.Utf8,  # the behaviour profile it is compared within: origin/task family (quality.anomalies)
    "started_at": pl.Datetime("us", "UTC"),
    "day": pl.Date,  # the started_at day (UTC): the z-score group with profile
    "status": pl.Utf8,
    "exit_reason": pl.Utf8,
    "eval_passed": pl.Boolean,
    "reward": pl.Float64,
    "n_cheat_flags": pl.Int64,
    "security_flagged": pl.Boolean,
    "cheat_weight": pl.Float64,  # the smallest governance weight of the session's detector flags
    "cheat_confirmed": pl.Boolean,
    "flag_names": pl.Utf8,  # detector flags, sorted, comma-separated
    "failure_cause": pl.Utf8,
    "retry_advice": pl.Utf8,
    "has_loop": pl.Boolean,
    **{name: pl.Float64 for name in FEATURES},
    "exact_key": pl.Int64,
    "signature": pl.Binary,  # num_perm little-endian uint32 MinHash values
    "bands": pl.List(pl.Int64),  # one LSH key per band
    "tool_counts": pl.Utf8,  # JSON tool name -> steps
    "exit_code_counts": pl.Utf8,  # JSON step exit code ("none": no code) -> steps
}
FACTS_SCHEMA = pl.Schema(_FACTS_SCHEMA_TYPES)


@dataclass
class SessionFacts:
    """Level-1 output for a set of sessions."""

    facts: pl.DataFrame  # FACTS_SCHEMA, one row per session
    cheat_flags: pl.DataFrame  # FLAGS_SCHEMA, the detectors' flags


#: Configuration that only level 2 reads: changing it recombines stored facts without recomputing them.
LEVEL2_THRESHOLDS = ("min_quality", "outlier_z", "min_profile_sessions", "dedup_threshold", "novelty_max_history")


def facts_digest(config: QualityConfig) -> str:
    """sha256 of the configuration the facts depend on (the manifest without weights and level-2 thresholds)."""
    manifest = config.manifest()
    manifest.pop("weights")
    manifest["thresholds"] = {k: v for k, v in manifest["thresholds"].items() if k not in LEVEL2_THRESHOLDS}
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def signatures_of(column: pl.Series, num_perm: int) -> np.ndarray:
    """The ``n × num_perm`` uint32 matrix of a ``signature`` column."""
    if column.len() == 0:
        return np.empty((0, num_perm), dtype=np.uint32)
    raw = b"".join(column.to_list())
    return np.frombuffer(raw, dtype="<u4").reshape(column.len(), num_perm).astype(np.uint32)


def session_facts(
    trajectories: pl.DataFrame,
    steps: pl.DataFrame,
    file_ops: pl.DataFrame,
    network: pl.DataFrame,
    config: QualityConfig | None = None,
    sessions: pl.DataFrame | None = None,
) -> SessionFacts:
    """Level-1 facts and detector flags of every session in ``trajectories``.

    Args:
        trajectories: the ``trajectories`` view's columns (session_id, task_id, task_type, task_family,
            status, exit_reason, started_at, resource figures, instruction, eval_passed, reward).
        steps: session_id, step_index, tool_name, command, arguments, exit_code, failure_reason, output.
        file_ops: session_id, seq, event_id, op, path, in_workspace, sha256.
        network: session_id, event_id, host, port, allowed.
        config: thresholds, governance and MinHash parameters.
        sessions: per-session context of the detectors (:data:`quality.cheats.SESSION_COLUMNS`).

    Returns:
        :class:`SessionFacts`, sorted by session id.
    """
    config = config or QualityConfig()
    # Integer session keys (sorted like the ids): string joins and group-bys over millions of step
    # rows dominate the run time otherwise. Outputs are decoded at the end.
    keys = trajectories.select("session_id").unique().sort("session_id").with_row_index("key")
    for column in ("task_family", "origin"):  # origin: a frame from before the column (tests): unknown
        if column not in trajectories.columns:
            trajectories = trajectories.with_columns(pl.lit(None, pl.Utf8).alias(column))
    trajectories, steps, file_ops, network = (encode(f, keys) for f in (trajectories, steps, file_ops, network))
    context = _detector_context(trajectories, sessions, keys)
    cheat_flags = detect_cheats(steps, file_ops, network, context, config).with_columns(
        pl.col("session_id").cast(keys.schema["key"])
    )
    per_session = _flags_per_session(cheat_flags, config)
    confirmed = per_session.filter("cheat_confirmed")["session_id"]
    causes = failure_causes(trajectories, steps, confirmed)
    documents = _documents(trajectories, steps, config)
    loops = _longest_identical_run(whole_action_tokens(steps))
    features = session_features(trajectories, steps).drop("task_type")
    counts = _step_counts(steps)
    facts = _facts(trajectories, [per_session, causes, loops, features, documents, counts], config)
    facts = decode(facts.select(list(FACTS_SCHEMA)), keys, ["session_id"]).cast(FACTS_SCHEMA).sort("session_id")
    flags = decode(cheat_flags.cast(FLAGS_SCHEMA), keys, ["session_id"]).sort("session_id", "flag")
    return SessionFacts(facts, flags)


def _detector_context(trajectories: pl.DataFrame, sessions: pl.DataFrame | None, keys: pl.DataFrame) -> pl.DataFrame:
    """The detectors' per-session context: the instruction and exit reason of ``trajectories`` (key-encoded),
    joined with the given ``sessions`` columns."""
    statement = pl.col("instruction").cast(pl.Utf8) if "instruction" in trajectories.columns else pl.lit(None, pl.Utf8)
    ended = pl.col("exit_reason").cast(pl.Utf8) if "exit_reason" in trajectories.columns else pl.lit(None, pl.Utf8)
    context = trajectories.select("session_id", statement.alias("instruction"), ended.alias("exit_reason"))
    if sessions is not None:
        given = encode(sessions.drop("instruction", "exit_reason", strict=False), keys)
        context = context.join(given, on="session_id", how="left")
    return context


def _flags_per_session(cheat_flags: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Per session with flags: their number, whether any is a security flag, the smallest governance weight,
    whether any is confirmed (or voids the verdict), and the flag names."""
    policies = config.policies()
    governance = pl.DataFrame(
        {
            "flag": list(policies),
            "weight": [p.weight for p in policies.values()],
            "voids": [p.voids_verdict for p in policies.values()],
        },
        schema={"flag": pl.Utf8, "weight": pl.Float64, "voids": pl.Boolean},
    )
    return (
        cheat_flags.join(governance, on="flag", how="left")
        .group_by("session_id")
        .agg(
            pl.len().cast(pl.Int64).alias("n_cheat_flags"),
            (pl.col("flag_class") == "security").any().alias("security_flagged"),
            pl.col("weight").fill_null(1.0).min().alias("cheat_weight"),
            (pl.col("voids").fill_null(False) | pl.col("confirmed")).any().alias("cheat_confirmed"),
            pl.col("flag").unique().sort().str.join(",").alias("flag_names"),
        )
    )


def _documents(trajectories: pl.DataFrame, steps: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Per session: the exact-duplicate key, the MinHash signature and its LSH band keys."""
    tokens = action_tokens(steps)
    docs = build_documents(trajectories, steps, config, tokens)
    signatures = docs.signatures[docs.exact_group]  # one row per session (sessions sorted by key)
    # each session's own task in its band keys: the index finds near-duplicates within a task only
    tasks = docs.sessions.select("session_id").join(
        trajectories.select("session_id", "task_id"), on="session_id", how="left", maintain_order="left"
    )
    bands = band_keys(signatures, config, task_keys(tasks["task_id"])).view(np.int64)
    return docs.sessions.select(
        "session_id",
        pl.col("exact_key").cast(pl.UInt64).reinterpret(signed=True).alias("exact_key"),
        pl.Series("signature", _binary_rows(signatures.astype("<u4"))),
        pl.Series("bands", _list_rows(bands)),
    )


def _facts(trajectories: pl.DataFrame, per_session: list[pl.DataFrame], config: QualityConfig) -> pl.DataFrame:
    """One row per session of ``trajectories``: its own columns, then each frame of ``per_session`` joined on
    ``session_id`` in turn, with the defaults of a session that has no row in one of them."""
    family = pl.coalesce(pl.col("task_family"), pl.col("task_id"))
    started = pl.col("started_at").cast(pl.Datetime("us", "UTC"))
    facts = trajectories.select(
        "session_id",
        "task_id",
        "task_type",
        "task_family",
        family.alias("family"),
        pl.col("origin").fill_null("unknown"),
        profile_key().alias("profile"),
        started.alias("started_at"),
        started.dt.date().alias("day"),
        "status",
        "exit_reason",
        "eval_passed",
        pl.col("reward").cast(pl.Float64),
    )
    for frame in per_session:
        facts = facts.join(frame, on="session_id", how="left")
    return facts.with_columns(
        pl.col("n_cheat_flags").fill_null(0),
        pl.col("security_flagged").fill_null(False),
        pl.col("cheat_weight").fill_null(1.0),
        pl.col("cheat_confirmed").fill_null(False),
        pl.col("flag_names").fill_null(""),
        (pl.col("max_run").fill_null(0) >= config.loop_run).alias("has_loop"),
        pl.col("tool_counts").fill_null("{}"),
        pl.col("exit_code_counts").fill_null("{}"),
    )


def _longest_identical_run(tokens: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``max_run``: longest run of identical consecutive actions (transient failures skipped).

    ``tokens`` are whole actions (:func:`quality.dedup.whole_action_tokens`): a repetition counts only
    when the tool and every argument repeat.
    """
    actions = tokens.filter(pl.col("failure_reason").is_null())
    changed = (pl.col("token") != pl.col("token").shift(1)) | (pl.col("session_id") != pl.col("session_id").shift(1))
    runs = actions.select("session_id", changed.fill_null(True).cum_sum().alias("run"))
    return (
        runs.group_by("run")
        .agg(pl.col("session_id").first(), pl.len())
        .group_by("session_id")
        .agg(pl.col("len").max().alias("max_run"))
    )


def _binary_rows(matrix: np.ndarray) -> pa.Array:
    """One binary value per row of a 2-D array, without a Python object per row."""
    n, width = matrix.shape[0], matrix.shape[1] * matrix.itemsize
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * width).tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(np.ascontiguousarray(matrix).tobytes())])


def _list_rows(matrix: np.ndarray) -> pa.Array:
    """One list<int64> per row of a 2-D int64 array."""
    n, width = matrix.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width)
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(matrix).reshape(-1)))


def _step_counts(steps: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``tool_counts``, ``exit_code_counts`` (JSON objects, keys sorted)."""
    frames = []
    for column, name in (("tool_name", "tool_counts"), ("exit_code", "exit_code_counts")):
        key = pl.col(column).cast(pl.Utf8).fill_null("none" if column == "exit_code" else "")
        grouped = steps.group_by("session_id", key.alias("k")).len()
        quoted = {k: json.dumps(k) for k in grouped["k"].unique().to_list()}  # few distinct keys
        frames.append(
            grouped.sort("session_id", "k")
            .with_columns(pl.col("k").replace_strict(quoted, return_dtype=pl.Utf8))
            .group_by("session_id", maintain_order=True)
            .agg(pl.format("{}: {}", "k", "len").str.join(", ").alias(name))
            .with_columns(pl.concat_str(pl.lit("{"), pl.col(name), pl.lit("}")).alias(name))
        )
    return frames[0].join(frames[1], on="session_id", how="full", coalesce=True)


def encode(frame: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Replace ``session_id`` by its integer key (rows of unknown sessions are dropped)."""
    columns = frame.columns
    return (
        frame.join(keys, on="session_id", how="inner").drop("session_id").rename({"key": "session_id"}).select(columns)
    )


def decode(frame: pl.DataFrame, keys: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """Integer keys (possibly cast to strings) in ``columns`` back to session ids."""
    lookup = keys.select(pl.col("key").cast(pl.Utf8), pl.col("session_id").alias("_id"))
    order = frame.columns
    for column in columns:
        frame = (
            frame.with_columns(pl.col(column).cast(pl.Utf8))
            .join(lookup, left_on=column, right_on="key", how="left")
            .drop(column)
            .rename({"_id": column})
        )
    return frame.select(order)
