"""Exact and near-duplicate trajectories: normalized action sequences, MinHash signatures, LSH.

A trajectory's document is its normalized instruction followed by its actions, each action
being ``tool_name`` + the command with whitespace collapsed, lower-cased, and long hex ids
(session ids, digests) replaced by a placeholder. Shingles are ``k`` consecutive actions. A
session without a single executed action matches nothing (its document is its own id): an empty
action sequence says nothing about what its model did.

- exact: equal hash of the whole normalized sequence;
- near: MinHash with datasketch's ``affine32`` scheme (its permutations and MurMur3
  finalizer; applied here to all documents at once with numpy, which gives the same hash values
  as ``datasketch.MinHash.update_batch`` — tested), LSH banding (``bands × rows``, defaults
  14×8 as in datatrove) to find candidates, then the estimated Jaccard ≥ threshold confirms.

Near-duplicates are found among sessions of the **same task** (the task instance, ``task_id``):
two tasks are two samples, however alike their solutions (``data_cli.fx`` and
``data_cli.group_sum`` may be solved by the same few commands). The task's key is mixed into
every LSH band key (:func:`band_keys`), so sessions of different tasks never share a bucket, and a
confirmed pair must be of one task. Exact duplicates (the same instruction and actions) may
cross anything. An exact group is one document whose task is its first session's.

Clusters are connected components of exact groups and confirmed pairs; the best trajectory
(highest quality, then earliest) represents its cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import polars as pl
from datasketch import MinHash
from datasketch.minhash import _fmix

from quality.config import QualityConfig

DUPLICATES_SCHEMA = pl.Schema(
    {
        "session_id": pl.Utf8,
        "cluster_id": pl.Utf8,
        "is_representative": pl.Boolean,
        "similarity": pl.Float64,
        "method": pl.Utf8,
    }
)
_HEX = r"[0-9a-f]{8,}"


@dataclass
class Documents:
    """Normalized documents of a set of sessions.

    Attributes:
        sessions: session ids, sorted; row ``i`` of every array belongs to ``sessions[i]``.
        exact_group: index of the exact-duplicate group of each session.
        signatures: MinHash signature per exact group (``groups × num_perm``, uint32).
        scopes: task key per exact group (:func:`task_keys`; near-duplicates only within one), None: any.
    """

    sessions: pl.DataFrame  # session_id, exact_key, exact_group
    signatures: np.ndarray
    scopes: np.ndarray | None = None

    @property
    def exact_group(self) -> np.ndarray:
        """Exact group index per session."""
        return self.sessions["exact_group"].to_numpy()


def task_keys(task_ids: pl.Series) -> np.ndarray:
    """A stable 64-bit key (uint64) per session's task (its ``task_id``; 0 for none).

    Stable across library versions (BLAKE2b), like :func:`session_keys`: the keys are mixed into
    band keys that stored indexes keep.
    """
    out = np.zeros(task_ids.len(), dtype=np.uint64)
    for i, task in enumerate(task_ids.to_list()):
        if task is not None:
            out[i] = int.from_bytes(hashlib.blake2b(f"task\x1f{task}".encode(), digest_size=8).digest(), "little")
    return out


def normalize_command(expr: pl.Expr) -> pl.Expr:
    """Lower-case, hex ids replaced, whitespace collapsed."""
    return (
        expr.fill_null("")
        .str.to_lowercase()
        .str.replace_all(_HEX, "<id>")
        .str.replace_all(r"\s+", " ")
        .str.strip_chars()
    )


def permutations(config: QualityConfig) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's ``affine32`` permutation parameters for ``config`` (num_perm, seed)."""
    a, b = MinHash(num_perm=config.num_perm, seed=config.seed, scheme="affine32").permutations
    return np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)


def minhash_signatures(doc_index: np.ndarray, hashes: np.ndarray, n_docs: int, config: QualityConfig) -> np.ndarray:
    """MinHash signatures of many documents at once.

    Args:
        doc_index: document of each shingle, ascending; every document has at least one shingle.
        hashes: 32-bit shingle hashes (what ``hashfunc`` returns in datasketch).
        n_docs: number of documents.
        config: permutations and seed.

    Returns:
        ``n_docs × num_perm`` uint32, equal to ``MinHash(num_perm, seed, scheme="affine32",
        hashfunc=identity).update_batch(hashes_of_doc).hashvalues`` per document.
    """
    a, b = permutations(config)
    starts = np.flatnonzero(np.r_[True, doc_index[1:] != doc_index[:-1]])
    if len(starts) != n_docs:
        raise ValueError(f"{n_docs} documents but {len(starts)} have shingles; each needs at least one")
    mixed = _fmix(hashes.astype(np.uint32), 32)
    out = np.empty((n_docs, len(a)), dtype=np.uint32)
    buffer = np.empty_like(mixed)  # reused: fresh temporaries per permutation cost page faults
    with np.errstate(over="ignore"):
        for j in range(len(a)):
            np.multiply(mixed, a[j], out=buffer)
            np.add(buffer, b[j], out=buffer)
            out[:, j] = np.minimum.reduceat(buffer, starts)
    return out


def action_tokens(steps: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``step_index``, ``token`` (hash of the normalized action), ``failure_reason``, sorted.

    Normalization runs once per distinct (tool, command) — commands repeat heavily across
    sessions — found through a cheap raw hash so that the join back is on integers.
    """
    raw = (pl.col("tool_name").fill_null("").hash(seed=5) ^ pl.col("command").fill_null("").hash(seed=6)).alias("raw")
    with_raw = steps.select(
        "session_id", pl.col("step_index").cast(pl.Int64), "tool_name", "command", "failure_reason", raw
    )
    distinct = (
        with_raw.select("raw", "tool_name", "command")
        .unique(subset="raw")
        .select(
            "raw",
            (pl.col("tool_name").fill_null("") + "\x1f" + normalize_command(pl.col("command")))
            .hash(seed=7)
            .alias("token"),
        )
    )
    return (
        with_raw.select("session_id", "step_index", "raw", "failure_reason")
        .join(distinct, on="raw", how="left")
        .select("session_id", "step_index", "token", "failure_reason")
        .sort("session_id", "step_index")
    )


def whole_action_tokens(steps: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``step_index``, ``token``, ``failure_reason``: a hash of the *whole* action, sorted.

    What the loop signal compares: the tool and every argument exactly as sent (``tool_name``,
    ``arguments``, ``command``), nothing normalised. Two actions are the same only when all of them
    are: an editor viewing two files (no ``command``, different ``arguments``) or a decompiler
    called on two functions whose names differ in a hex digit are two different actions. (Near-
    duplicate detection keeps its normalised tokens, :func:`action_tokens`.)
    """
    absent = "\x00"  # a missing field, unequal to any text
    arguments = pl.col("arguments") if "arguments" in steps.columns else pl.lit(None, pl.Utf8)
    whole = pl.struct(
        pl.col("tool_name").cast(pl.Utf8).fill_null(absent).alias("t"),
        arguments.cast(pl.Utf8).fill_null(absent).alias("a"),
        pl.col("command").cast(pl.Utf8).fill_null(absent).alias("c"),
    )
    return steps.select(
        "session_id", pl.col("step_index").cast(pl.Int64), whole.hash(seed=13).alias("token"), "failure_reason"
    ).sort("session_id", "step_index")


def build_documents(
    trajectories: pl.DataFrame, steps: pl.DataFrame, config: QualityConfig, tokens: pl.DataFrame | None = None
) -> Documents:
    """Normalized action documents, exact groups and MinHash signatures.

    Args:
        trajectories: session_id, instruction (every session gets a document, even without steps).
        steps: session_id, step_index, tool_name, command (ignored when ``tokens`` is given).
        config: shingle size and MinHash parameters.
        tokens: precomputed :func:`action_tokens` of ``steps``.
    """
    tokens = action_tokens(steps) if tokens is None else tokens  # sorted by session, step
    if "task_id" not in trajectories.columns:
        trajectories = trajectories.with_columns(pl.lit(None, pl.Utf8).alias("task_id"))
    acted = tokens.select("session_id").unique()["session_id"].implode()
    instruction = ("instruction\x1f" + normalize_command(pl.col("instruction").cast(pl.Utf8))).hash(seed=7)
    # A session that executed no action has nothing to be a duplicate of: its document is its own id, so
    # an empty capped run never stands in for (or is dropped in favour of) a real conversation.
    alone = ("no actions\x1f" + pl.col("session_id").cast(pl.Utf8)).hash(seed=7)
    instructions = trajectories.select(
        "session_id",
        pl.when(pl.col("session_id").is_in(acted)).then(instruction).otherwise(alone).alias("head"),
        pl.col("task_id").cast(pl.Utf8),
    ).sort("session_id")
    per_session = tokens.group_by("session_id", maintain_order=True).agg(pl.col("token"))
    sessions = instructions.join(per_session, on="session_id", how="left", maintain_order="left").select(
        "session_id", (pl.col("head") ^ pl.col("token").hash(seed=11)).alias("exact_key")
    )
    # One document (and signature) per exact group, numbered in session order so that the shingle
    # rows below stay sorted by document without another sort.
    firsts = sessions.unique("exact_key", keep="first", maintain_order=True).select(
        "session_id", "exact_key", pl.int_range(pl.len(), dtype=pl.Int64).alias("exact_group")
    )
    sessions = sessions.join(
        firsts.select("exact_key", "exact_group"), on="exact_key", how="left", maintain_order="left"
    )
    doc_tokens = tokens.join(
        firsts.select("session_id", "exact_group"), on="session_id", how="inner", maintain_order="left"
    )
    shingle = pl.col("token")
    for k in range(1, config.shingle_size):
        shingle = shingle * 1_000_003 + pl.col("token").shift(-k).over("exact_group").fill_null(0)
    shingled = doc_tokens.select("exact_group", (shingle.hash(seed=3) & 0xFFFFFFFF).alias("h"))
    heads = firsts.join(instructions, on="session_id", how="left", maintain_order="left")
    # the instruction is one more shingle of each document (and the only one of a step-less session)
    doc_index = np.concatenate([heads["exact_group"].to_numpy(), shingled["exact_group"].to_numpy()])
    hashes = np.concatenate(
        [(heads["head"].to_numpy() & 0xFFFFFFFF).astype(np.uint32), shingled["h"].to_numpy().astype(np.uint32)]
    )
    order = np.argsort(doc_index, kind="stable")
    signatures = minhash_signatures(doc_index[order], hashes[order], firsts.height, config)
    return Documents(
        sessions.select("session_id", "exact_key", "exact_group"),
        signatures,
        task_keys(heads["task_id"]),
    )


def estimated_similarity(sig: np.ndarray, left: np.ndarray, right: np.ndarray, chunk: int = 1 << 18) -> np.ndarray:
    """Estimated Jaccard similarity of signature rows ``left[i]`` and ``right[i]``."""
    out = np.empty(len(left), dtype=np.float64)
    for start in range(0, len(left), chunk):
        sl = slice(start, start + chunk)
        out[sl] = (sig[left[sl]] == sig[right[sl]]).mean(axis=1)
    return out


#: Odd 64-bit constant mixing a task key into band keys (sessions of two tasks never share a bucket).
_TASK_MIX = np.uint64(0xD6E8FEB86659FD93)


def band_keys(signatures: np.ndarray, config: QualityConfig, scopes: np.ndarray | None = None) -> np.ndarray:
    """LSH band keys (``n × bands`` uint64): rows equal in one band's key are candidate duplicates.

    ``scopes``: a task key per row (:func:`task_keys`), mixed into every band's key so that only
    rows of one task can be candidates; None: rows of any task.
    """
    rng = np.random.default_rng(config.seed)
    mult = rng.integers(1, 1 << 62, size=config.dedup_rows, dtype=np.uint64) | np.uint64(1)
    out = np.zeros((signatures.shape[0], config.dedup_bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(config.dedup_bands):
            cols = signatures[:, band * config.dedup_rows : (band + 1) * config.dedup_rows].astype(np.uint64)
            out[:, band] = (cols * mult).sum(axis=1, dtype=np.uint64) ^ (cols[:, 0] << np.uint64(32))
        if scopes is not None:
            out ^= (scopes.astype(np.uint64) * _TASK_MIX)[:, None]
    return out


#: Odd 64-bit constant (the golden ratio's): multiplied by the band number, it keeps band keys of different bands apart.
_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)


def flat_band_keys(keys: np.ndarray, band: np.ndarray) -> np.ndarray:
    """One int64 per (key, band number ≥ 1) pair: the band number mixed into the LSH key.

    Equal only where the keys of the same band are (up to 64-bit collisions): a table of these
    can be probed with a plain equality join instead of by (band, key) pairs.
    """
    with np.errstate(over="ignore"):
        mixed = keys.astype(np.int64).view(np.uint64) ^ (band.astype(np.uint64) * _BAND_MIX)
    return mixed.view(np.int64)


def session_keys(session_ids: pl.Series) -> pl.Series:
    """A stable 64-bit key per session id (the first 8 bytes of its BLAKE2b digest, signed).

    Stable across library versions (unlike ``polars``' or DuckDB's ``hash``), so keys stored in a
    table stay comparable with keys computed later. Two ids may share a key (about 1 in 10⁷ for a
    lakehouse of 5M sessions); a lookup by key then finds both, which the callers allow for.
    """
    digests = [
        int.from_bytes(hashlib.blake2b(sid.encode(), digest_size=8).digest(), "little", signed=True)
        if sid is not None
        else None
        for sid in session_ids.to_list()
    ]
    return pl.Series("session_key", digests, dtype=pl.Int64)


def lsh_pairs(
    signatures: np.ndarray, config: QualityConfig, scopes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate pairs from LSH banding, confirmed by estimated Jaccard ≥ threshold (and one task, given ``scopes``).

    Returns:
        (left, right, similarity) arrays over signature rows, ``left < right``.
    """
    n = signatures.shape[0]
    if n < 2:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, np.empty(0)
    keys = band_keys(signatures, config, scopes)
    lefts, rights = [], []
    for band in range(config.dedup_bands):
        key = keys[:, band]
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        same = np.flatnonzero(sorted_key[1:] == sorted_key[:-1]) + 1
        if not len(same):
            continue
        # link each member of a bucket to the bucket's first row
        bucket_start = np.maximum.accumulate(np.where(np.r_[True, sorted_key[1:] != sorted_key[:-1]], np.arange(n), 0))
        lefts.append(order[bucket_start[same]])
        rights.append(order[same])
    if not lefts:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, np.empty(0)
    left = np.concatenate(lefts)
    right = np.concatenate(rights)
    lo, hi = np.minimum(left, right), np.maximum(left, right)
    pairs = np.unique(np.stack([lo, hi], axis=1), axis=0)
    similarity = estimated_similarity(signatures, pairs[:, 0], pairs[:, 1])
    keep = similarity >= config.dedup_threshold
    if scopes is not None:  # a 64-bit collision of two tasks' mixed keys is not a reason to link them
        keep &= scopes[pairs[:, 0]] == scopes[pairs[:, 1]]
    return pairs[keep, 0], pairs[keep, 1], similarity[keep]


def components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Connected-component label of each of ``n`` nodes linked by the ``left``–``right`` pairs."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def find_duplicates(docs: Documents, ranking: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Duplicate clusters (only sessions in clusters of two or more).

    Args:
        docs: from :func:`build_documents`.
        ranking: session_id, quality, started_at — the representative is the best quality,
            then the earliest, then the smallest session id.
        config: LSH parameters and threshold.

    Returns:
        :data:`DUPLICATES_SCHEMA` rows; ``similarity`` is the estimated Jaccard similarity to
        the representative; ``method`` is ``exact`` (same normalized sequence as the
        representative) or ``minhash``.
    """
    left, right, _ = lsh_pairs(docs.signatures, config, docs.scopes)
    component = components(docs.signatures.shape[0], left, right)
    members = docs.sessions.with_columns(pl.Series("component", component[docs.exact_group]))
    members = members.filter(pl.len().over("component") > 1)
    if members.is_empty():
        return pl.DataFrame(schema=DUPLICATES_SCHEMA)
    ranked = members.join(ranking.select("session_id", "quality", "started_at"), on="session_id", how="left").sort(
        ["component", "quality", "started_at", "session_id"], descending=[False, True, False, False], nulls_last=True
    )
    reps = ranked.group_by("component", maintain_order=True).agg(
        pl.col("session_id").first().alias("rep_id"), pl.col("exact_group").first().alias("rep_group")
    )
    out = ranked.join(reps, on="component", how="left")
    similarity = estimated_similarity(docs.signatures, out["exact_group"].to_numpy(), out["rep_group"].to_numpy())
    return out.select(
        "session_id",
        pl.col("rep_id").alias("cluster_id"),
        (pl.col("session_id") == pl.col("rep_id")).alias("is_representative"),
        pl.Series("similarity", similarity).round(4),
        pl.when(pl.col("exact_group") == pl.col("rep_group"))
        .then(pl.lit("exact"))
        .otherwise(pl.lit("minhash"))
        .alias("method"),
    ).sort("cluster_id", "session_id")
