"""What an export selects and how it streams: outcome, filters, the split by task family, sessions with steps and calls.

Selection, in order (the manifest counts the sessions each rule left out, by the first rule
that left them out): an **origin** the export asks for (by default every origin but ``synthetic``:
the synthetic load fleet's sessions are for benchmarks, never training data); scored; ended; an
**outcome** the export asks for; no security flag; the representative of its duplicate cluster;
``quality >= min_quality``. What the outcome and the
threshold are by default depends on the format:

- SFT formats (``hf``, ``openai``, ``sharegpt``): ``success`` — evaluated, passed, not voided by a
  flag, not cut by a crash — and ``TRAJLAKE_QUALITY_MIN``: a training example is a verified success.
- ``rl`` (and ``verl``, ``skyrl``): ``any`` — every evaluated session of the policy, success or failure, with its reward
  (failures are signal there), threshold 0; never an infrastructure failure, a crash of the agent
  harness or an unevaluated run, which say nothing about the policy.
- ``atif``: ``all`` — every ended session (an interchange format, not a training set), threshold 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from pipelines.errors import ExportError
from pipelines.intake.ownership import has_payload_field
from pipelines.intake.parts import blob_texts
from producers.importers.verdicts import SELF_REPORTED
from quality.failure import EVALUATED_OUTCOMES, OUTCOMES

if TYPE_CHECKING:
    import duckdb

    from warehouse.lakehouse import Lakehouse

#: Split shares (percent of task families, by the sha256 of the family name).
SPLIT_PERCENT = {"train": 80, "validation": 10, "test": 10}
#: Formats a trainer fine-tunes on (supervised): they default to verified successes.
SFT_FORMATS = ("hf", "openai", "sharegpt")
#: Formats whose records are RL samples (``rl`` and the trainers' own): every evaluated policy session.
RL_FORMATS = ("rl", "verl", "skyrl")
#: ``--outcome`` values and the session outcomes (``scores.outcome``) each selects.
OUTCOME_CHOICES: dict[str, tuple[str, ...]] = {
    "success": ("success",),
    "failure": ("failure",),
    "any": EVALUATED_OUTCOMES,
    "all": tuple(o for o in OUTCOMES if o != "running"),
}


#: Origins of sessions (``trajectories.origin``, :data:`pipelines.assemble.ORIGINS`); ``import:<format>`` besides.
ORIGIN_NAMES = ("sandbox", "synthetic", "sdk", "otlp", "import")
#: Origins an export leaves out unless ``--origin`` names them: load-generator text is no training data.
DEFAULT_EXCLUDED_ORIGINS = ("synthetic",)


def parse_origins(text: str | None) -> tuple[str, ...] | None:
    """``--origin``: a comma-separated list of origins (``import`` = every ``import:<format>``), or ``all``.

    Returns:
        None for the default (every origin but synthetic), ``()`` for ``all``, else the origins named.

    Raises:
        ExportError: an origin outside the vocabulary.
    """
    if text is None or not text.strip():
        return None
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if names == ("all",):
        return ()
    for name in names:
        if name not in ORIGIN_NAMES and not (name.startswith("import:") and len(name) > len("import:")):
            raise ExportError(f"unknown origin {name!r}; choose from {', '.join(ORIGIN_NAMES)}, import:<format> or all")
    return names


def origin_condition(origins: tuple[str, ...] | None) -> str:
    """The SQL condition an origin selection puts on ``t.origin`` (NULL: a row assembled before origins: ``sdk``)."""
    column = "coalesce(t.origin, 'sdk')"
    if origins is None:
        return f"{column} NOT IN ({', '.join(repr(o) for o in DEFAULT_EXCLUDED_ORIGINS)})"
    if not origins:
        return "TRUE"
    exact = [o for o in origins if o != "import"]
    parts = [f"{column} IN ({', '.join(repr(o) for o in exact)})"] if exact else []
    if "import" in origins:
        parts.append(f"starts_with({column}, 'import:')")
    return " OR ".join(parts)


def default_outcome(fmt: str) -> str:
    """The outcome a format exports unless told otherwise (see the module docstring)."""
    return "success" if fmt in SFT_FORMATS else "any" if fmt in RL_FORMATS else "all"


@dataclass(frozen=True)
class ExportFilters:
    """What an export selects.

    Attributes:
        min_quality: quality at least this (None: ``TRAJLAKE_QUALITY_MIN`` for SFT formats, 0 otherwise).
        outcome: ``success``, ``failure``, ``any`` (both: every evaluated policy session) or ``all``
            (every ended session); None: the format's default (:func:`default_outcome`).
        day: only sessions started on this UTC day (the nightly partition).
        policy_version: only this policy version.
        task_family: only this task family.
        since: started at or after this instant.
        until: started before this instant.
        split: only this split (``train``, ``validation``, ``test``; by task family, see :func:`split_of`).
        group_complete: only rollout groups whose K attempts all finished and all pass the filters.
        origins: only sessions of these origins (:func:`parse_origins`); None: every origin but ``synthetic``;
            ``()``: every origin.
    """

    min_quality: float | None = None
    outcome: str | None = None
    day: date | None = None
    policy_version: str | None = None
    task_family: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    split: str | None = None
    group_complete: bool = False
    origins: tuple[str, ...] | None = None

    def for_format(self, fmt: str, quality_min: float) -> ExportFilters:
        """These filters with the format's defaults filled in.

        Raises:
            ExportError: an unknown outcome or split.
        """
        outcome = self.outcome or default_outcome(fmt)
        if outcome not in OUTCOME_CHOICES:
            raise ExportError(f"unknown outcome {outcome!r}; choose one of {', '.join(OUTCOME_CHOICES)}")
        if self.split is not None and self.split not in SPLIT_PERCENT:
            raise ExportError(f"unknown split {self.split!r}; choose one of {', '.join(SPLIT_PERCENT)}")
        threshold = self.min_quality
        if threshold is None:
            threshold = quality_min if fmt in SFT_FORMATS else 0.0
        return replace(self, outcome=outcome, min_quality=threshold)

    def as_dict(self) -> dict[str, object]:
        """Plain JSON for the manifest."""
        return {
            "rules": "origin, scored, ended, outcome, no security flag, representative of its duplicate cluster, "
            "min_quality",
            "origins": (
                {"all_but": list(DEFAULT_EXCLUDED_ORIGINS)}
                if self.origins is None
                else "all"
                if not self.origins
                else list(self.origins)
            ),
            "outcome": self.outcome,
            "outcomes": list(OUTCOME_CHOICES.get(self.outcome or "", ())),
            "min_quality": self.min_quality,
            "day": self.day.isoformat() if self.day else None,
            "policy_version": self.policy_version,
            "task_family": self.task_family,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "split": self.split,
            "group_complete": self.group_complete,
        }


def split_of(task_family: str | None) -> str:
    """The split of a task family: the sha256 of its name (first 60 bits) mod 100, 80 train, 10 validation, 10 test.

    Deterministic and by family, so every session of a family lands in one split (no family in two).
    """
    bucket = int(hashlib.sha256((task_family or "").encode()).hexdigest()[:15], 16) % 100
    return (
        "train" if bucket < SPLIT_PERCENT["train"] else "validation" if bucket < 100 - SPLIT_PERCENT["test"] else "test"
    )


def _scope(filters: ExportFilters) -> tuple[list[str], dict[str, Any]]:
    """The WHERE conditions of the population an export considers (day, policy, family, time)."""
    where: list[str] = []
    params: dict[str, Any] = {}
    if filters.day:
        where.append("CAST(t.started_at AS DATE) = $day")
        params["day"] = filters.day
    if filters.policy_version is not None:
        where.append("t.policy_version = $pv")
        params["pv"] = filters.policy_version
    if filters.task_family is not None:
        where.append("coalesce(t.task_family, s.task_family, t.task_id) = $tf")
        params["tf"] = filters.task_family
    if filters.since:
        where.append("t.started_at >= $since")
        params["since"] = filters.since
    if filters.until:
        where.append("t.started_at < $until")
        params["until"] = filters.until
    if filters.split:
        where.append(f"{_split_sql('coalesce(t.task_family, s.task_family, t.task_id)')} = $split")
        params["split"] = filters.split
    return where, params


def _rules(filters: ExportFilters) -> list[tuple[str, str]]:
    """(name, condition) of each selection rule, in the order the manifest counts them."""
    chosen = ", ".join(f"'{o}'" for o in OUTCOME_CHOICES[filters.outcome or "all"])
    return [
        ("origin", origin_condition(filters.origins)),
        ("unscored", "s.session_id IS NOT NULL"),
        ("running", "s.outcome IS DISTINCT FROM 'running' AND s.failure_cause IS DISTINCT FROM 'still_running'"),
        ("outcome", f"s.outcome IN ({chosen})"),
        ("security_flag", "NOT s.security_flagged"),
        ("duplicate", "s.session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)"),
        ("min_quality", "s.quality >= $q"),
    ]


def _selection(filters: ExportFilters) -> tuple[str, dict[str, Any]]:
    """The WHERE clause choosing sessions (over ``trajectories t LEFT JOIN scores s``)."""
    where, params = _scope(filters)
    where += [f"({condition})" for _, condition in _rules(filters)]
    params["q"] = filters.min_quality if filters.min_quality is not None else 0.0
    return " AND ".join(where) or "TRUE", params


def left_out(con: Any, filters: ExportFilters) -> dict[str, Any]:
    """Sessions considered and how many each rule left out (the first rule a session fails; outcomes apart).

    Returns:
        ``{"considered": n, "left_out": {"running": n, "outcome": {"failure": n, …}, …}}``.
    """
    scope, params = _scope(filters)
    params["q"] = filters.min_quality if filters.min_quality is not None else 0.0
    rules = _rules(filters)
    first = " ".join(f"WHEN NOT coalesce(({condition}), FALSE) THEN '{name}'" for name, condition in rules)
    rows = con.execute(
        f"SELECT CASE {first} ELSE 'chosen' END AS rule, coalesce(s.outcome, 'unscored') AS outcome, "
        "coalesce(t.origin, 'sdk') AS origin, count(*) "
        f"FROM trajectories t LEFT JOIN scores s USING (session_id) WHERE {' AND '.join(scope) or 'TRUE'} "
        "GROUP BY ALL",
        params,
    ).fetchall()
    counts: dict[str, Any] = {name: 0 for name, _ in rules if name not in ("outcome", "origin")}
    counts["origin"], counts["outcome"] = {}, {}
    considered = 0
    by_origin: dict[str, int] = {}
    for rule, outcome, origin, n in rows:
        considered += n
        by_origin[origin] = by_origin.get(origin, 0) + n
        if rule in ("outcome", "origin"):
            key = outcome if rule == "outcome" else origin
            counts[rule][key] = counts[rule].get(key, 0) + n
        elif rule != "chosen":
            counts[rule] += n
    return {"considered": considered, "considered_by_origin": by_origin, "left_out": counts}


class _Blobs:
    """Model-call content another session emitted (the host stores each text once), looked up and cached.

    The lookup runs on its own connection (a query on the one streaming the sessions would end the
    stream), opened by ``connect`` on the first lookup: an export whose calls carry their own text opens none.
    """

    def __init__(self, connect: Callable[[], Any], capacity: int = 4096) -> None:
        self.connect, self.capacity = connect, capacity
        self.opened: Any = None
        self.cache: dict[str, str] = {}

    @property
    def con(self) -> Any:
        """The lookup's connection (opened now if it was not)."""
        if self.opened is None:
            self.opened = self.connect()
        return self.opened

    def __call__(self, refs: Iterable[str]) -> dict[str, str]:
        wanted = list(refs)
        missing = [r for r in wanted if r not in self.cache]
        if missing:
            rows = self.con.execute(
                "SELECT DISTINCT b.sha256, b.text FROM (SELECT unnest(agent_input.model_call.blobs) AS b FROM events "
                "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL) WHERE b.sha256 IN "
                "(SELECT unnest($refs))",
                {"refs": missing},
            ).fetchall()
            if len(self.cache) > self.capacity:
                self.cache.clear()
            self.cache.update({sha: text for sha, text in rows})
            # a blob too large for one event travelled in parts (``producers.parts``)
            self.cache.update(blob_texts(self.con, [r for r in missing if r not in self.cache]))
        return {r: self.cache[r] for r in wanted if r in self.cache}


#: The split of a task family in SQL, equal to :func:`split_of` (first 60 bits of the sha256, mod 100).
_SPLIT_SQL = (
    "CASE WHEN ('0x' || substr(sha256(coalesce({f}, '')), 1, 15))::UBIGINT % 100 < {train} THEN 'train' "
    "WHEN ('0x' || substr(sha256(coalesce({f}, '')), 1, 15))::UBIGINT % 100 < {val} THEN 'validation' "
    "ELSE 'test' END"
)


def _split_sql(column: str) -> str:
    return _SPLIT_SQL.format(f=column, train=SPLIT_PERCENT["train"], val=100 - SPLIT_PERCENT["test"])


#: Each chosen session's row (kind 0), within a chunk: ``WHERE r.<within>`` is appended.
_SESSION_ROWS = "SELECT r.session_id, 0 AS kind, 0 AS pos, r AS session FROM chosen_rows r"
# A step's model input (prompt and cached tokens) is on the agent_input event of its model
# message; the first action of the message carries it (a session without recorded calls).
_STEP_ROWS = (
    "SELECT s.session_id, 1 AS kind, s.step_index AS pos, struct_pack(s.step_index, s.tool_name, s.tool_call_id, "
    "s.arguments, s.command, s.thought, s.output, s.exit_code, s.ts, s.output_tokens, s.reasoning_tokens, "
    "s.cost_usd, input_tokens := u.input_tokens, cached_tokens := u.cached_tokens) AS step FROM steps s "
    "LEFT JOIN (SELECT a.event_id AS action_event_id, i.input_tokens, i.cached_tokens FROM "
    "(SELECT session_id, event_id, agent_message_id, seq FROM events WHERE event_type = 'agent_action' "
    "AND {within}) a JOIN (SELECT session_id, agent_message_id, "
    "TRY_CAST(sum(agent_input.input_tokens) AS BIGINT) AS input_tokens, "
    "TRY_CAST(sum(agent_input.cached_tokens) AS BIGINT) AS cached_tokens "
    "FROM events WHERE event_type = 'agent_input' "
    "AND agent_input.model_call IS NULL AND {within} GROUP BY ALL) i USING (session_id, agent_message_id) "
    "QUALIFY row_number() OVER (PARTITION BY a.session_id, a.agent_message_id ORDER BY a.seq) = 1) u "
    "USING (action_event_id) WHERE s.session_id IN (SELECT session_id FROM chosen)"
)
#: Each chosen session's model calls (kind 2), within a chunk: ``AND <within>`` is appended.
_CALL_ROWS = (
    "SELECT session_id, 2 AS kind, seq AS pos, struct_pack(ts, mc := agent_input.model_call, "
    "pv := coalesce(extra['policy_version'], policy_version), engine := extra['engine'], dtype := extra['dtype'], "
    "system_fingerprint := extra['system_fingerprint']) AS call FROM events "
    "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL "
    "AND session_id IN (SELECT session_id FROM chosen)"
)


def _sessions(
    lake: Lakehouse,
    filters: ExportFilters,
    weights: dict[str, float],
    batch_rows: int = 8192,
    chunk_sessions: int = 4096,
    report: dict[str, Any] | None = None,
    memory_limit: str = "512MB",
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], _Blobs]]:
    """Chosen sessions in ``session_id`` order with their steps and model calls (text redacted later, per record).

    Per chunk of ``chunk_sessions`` session ids, one query streams the session rows, their steps and
    their model calls as one sequence ordered by session id (kind 0, 1, 2 within a session), read in
    Arrow batches: memory is bounded by a chunk, not by the export's size. ``report`` (when given)
    receives the sessions considered and what each rule left out (:func:`left_out`); ``memory_limit`` is
    DuckDB's for the ordering (``TRAJLAKE_EXPORT_MEMORY_LIMIT``).
    """
    con = _export_connection(lake, memory_limit)
    _choose(con, filters, report)
    _gather_session_rows(con)
    ranges = _chunk_ranges(con, chunk_sessions)
    lookup = _Blobs(lake.views)
    for low, high in ranges:
        within = "session_id BETWEEN $low AND $high"
        reader = con.sql(
            f"SELECT * FROM ({_SESSION_ROWS} WHERE r.{within}) UNION ALL BY NAME "
            f"SELECT * FROM ({_STEP_ROWS.format(within=within)} AND s.{within}) UNION ALL BY NAME "
            f"SELECT * FROM ({_CALL_ROWS} AND {within}) ORDER BY session_id, kind, pos",
            params={"low": low, "high": high},
        ).to_arrow_reader(batch_rows)
        yield from _grouped(reader, weights, lookup)


def _export_connection(lake: Lakehouse, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """The lake's views on a connection whose ordering spills past ``memory_limit``."""
    con = lake.views()
    spill = lake.scratch("export")
    # past the limit the ordering spills to TRAJLAKE_HOME/tmp/export: an export's memory does not follow its size
    con.execute(f"SET memory_limit = '{memory_limit.strip()}'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET threads = 2")  # each thread holds its own sort buffers
    return con


def _choose(con: duckdb.DuckDBPyConnection, filters: ExportFilters, report: dict[str, Any] | None) -> None:
    """The temp table ``chosen``: the sessions the filters choose (whole groups only, when asked)."""
    where, params = _selection(filters)
    if report is not None:
        report.update(left_out(con, filters))
    con.execute(
        "CREATE TEMP TABLE chosen AS SELECT t.session_id, t.task_id, t.task_type, t.instruction, s.quality, "
        "s.completion, s.flags, coalesce(t.task_family, s.task_family, t.task_id) AS task_family, t.policy_version, "
        "t.group_id, t.attempt, t.agent_name, t.agent_version, t.agent_model, t.status, t.exit_reason, t.reward, "
        "t.eval_passed, t.verdict_provenance, s.failure_cause, s.outcome, t.started_at, "
        "coalesce(t.origin, 'sdk') AS origin, "
        "t.input_tokens, t.cached_tokens, t.output_tokens, t.cost_usd "
        f"FROM trajectories t LEFT JOIN scores s USING (session_id) WHERE {where}",
        params,
    )
    if filters.group_complete:
        before = con.execute("SELECT count(*) FROM chosen").fetchone()
        # a group is whole when every attempt 0..K-1 exists, none is running and all K were chosen
        con.execute(
            "DELETE FROM chosen WHERE group_id IS NULL OR group_id NOT IN (SELECT g.group_id FROM (SELECT group_id, "
            "count(DISTINCT attempt) AS k, max(attempt) AS top, bool_and(status <> 'running') AS done, count(*) AS n "
            "FROM trajectories WHERE group_id IS NOT NULL GROUP BY group_id) g JOIN (SELECT group_id, count(*) AS n "
            "FROM chosen GROUP BY group_id) c USING (group_id) WHERE g.done AND g.k = g.top + 1 AND c.n = g.n)"
        )
        after = con.execute("SELECT count(*) FROM chosen").fetchone()
        if report is not None and before and after:
            report.setdefault("left_out", {})["group_incomplete"] = int(before[0]) - int(after[0])


def _gather_session_rows(con: duckdb.DuckDBPyConnection) -> None:
    """The temp table ``chosen_rows``: each chosen session with its flags, submission, provenance and claim."""
    # a verdict the run's own file claimed (self-reported): never counted, but an ATIF export restates it
    claim = (
        "(SELECT session_id, arg_max(struct_pack(passed := evaluation.passed, reward := evaluation.reward, "
        "details := evaluation.details), struct_pack(seq, event_id)) AS claimed_verdict FROM events "
        f"WHERE event_type = 'evaluation' AND evaluation.provenance = '{SELF_REPORTED}' "
        "AND session_id IN (SELECT session_id FROM chosen) GROUP BY session_id)"
        if has_payload_field(con, "evaluation", "provenance", table="events")
        else "(SELECT NULL::VARCHAR AS session_id, NULL AS claimed_verdict WHERE false)"
    )
    con.execute(
        "CREATE TEMP TABLE chosen_rows AS SELECT c.*, f.flag_list, "
        "coalesce(sub.submission, jp.judged_patch) AS submission, ps.carried_prompt_source, "
        "ps.source_session_id, cl.claimed_verdict "
        "FROM chosen c "
        "LEFT JOIN (SELECT session_id, list(struct_pack(flag := flag, flag_class := flag_class, severity := severity) "
        "ORDER BY flag) AS flag_list FROM flags WHERE session_id IN (SELECT session_id FROM chosen) "
        "GROUP BY session_id) f USING (session_id) "
        # the submission whole: the step's output (assembly rebuilt a text that travelled in parts), else the event's
        "LEFT JOIN (SELECT e.session_id, arg_max(coalesce(st.output, fb.env_feedback.output), fb.seq) AS submission "
        "FROM events e JOIN events fb ON fb.event_id = e.extra['submission_event_id'] "
        "LEFT JOIN steps st ON st.session_id = fb.session_id AND st.feedback_event_id = fb.event_id "
        "WHERE e.event_type = 'session_end' "
        "AND e.session_id IN (SELECT session_id FROM chosen) GROUP BY e.session_id) sub USING (session_id) "
        # else the patch the fleet's evaluator judged (the local sandbox fleet records it on ``evaluation``; an
        # import of a run whose patch no event held, on ``session_end``)
        "LEFT JOIN (SELECT session_id, arg_max(extra['submission'], struct_pack(seq, event_id)) AS judged_patch "
        "FROM events WHERE event_type IN ('evaluation', 'session_end') AND extra['submission'] IS NOT NULL "
        "AND session_id IN (SELECT session_id FROM chosen) GROUP BY session_id) jp USING (session_id) "
        # how an imported run's conversation was first obtained (an ATIF export of a rebuilt one says so),
        # and the run's own id in the file it came from
        "LEFT JOIN (SELECT session_id, arg_min(extra['prompt_source'], seq) AS carried_prompt_source, "
        "arg_min(extra['source_session_id'], seq) AS source_session_id FROM events "
        "WHERE event_type = 'session_start' AND session_id IN (SELECT session_id FROM chosen) "
        f"GROUP BY session_id) ps USING (session_id) LEFT JOIN {claim} cl USING (session_id)"
    )
    # a run's own id names it in an export only when no other session could be meant by it: not another
    # session's id in this lake, not the own id of another chosen session
    con.execute(
        "UPDATE chosen_rows SET source_session_id = NULL WHERE source_session_id IN "
        "(SELECT session_id FROM trajectories) OR source_session_id IN (SELECT source_session_id FROM chosen_rows "
        "WHERE source_session_id IS NOT NULL GROUP BY source_session_id HAVING count(*) > 1)"
    )


def _chunk_ranges(con: duckdb.DuckDBPyConnection, chunk_sessions: int) -> list[Any]:
    """(first, last) session id of each chunk of ``chunk_sessions`` chosen sessions, in order."""
    # Ordered in chunks of session ids (row groups are sorted by session, so a range reads few of
    # them): each query sorts one chunk, so memory follows the chunk, never the export's size.
    return con.sql(
        f"SELECT min(session_id), max(session_id) FROM (SELECT session_id, (row_number() OVER "
        f"(ORDER BY session_id) - 1) // {int(chunk_sessions)} AS part FROM chosen_rows) GROUP BY part ORDER BY part"
    ).fetchall()


def _grouped(
    reader: Any, weights: dict[str, float], lookup: _Blobs
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], _Blobs]]:
    """Sessions with their steps and calls from one stream ordered by (session_id, kind, pos)."""
    current: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for batch in reader:
        for row in batch.to_pylist():
            kind = row["kind"]
            if kind == 0:
                if current is not None:
                    yield current, steps, calls, lookup
                current, steps, calls = _session(row["session"], weights), [], []
            elif current is not None and row["session_id"] == current["session_id"]:
                if kind == 1:
                    steps.append(row["step"])
                else:
                    call = row["call"]
                    served = {k: call[k] for k in ("engine", "dtype", "system_fingerprint") if call.get(k)}
                    calls.append({**call["mc"], "_ts": call["ts"], "_policy_version": call["pv"], "_served": served})
    if current is not None:
        yield current, steps, calls, lookup


def _session(session: dict[str, Any], weights: dict[str, float]) -> dict[str, Any]:
    """A session row with its split, its flags' governance weights and the down-weighting they apply."""
    session["split"] = split_of(session["task_family"])
    flags = session.pop("flag_list") or []
    for flag in flags:
        flag["weight"] = weights.get(flag["flag"], 1.0)
    session["flag_list"] = flags
    session["weight"] = min((flag["weight"] for flag in flags), default=1.0)
    return session
