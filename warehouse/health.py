"""Cost and health views over the lakehouse's own tables: ``costs``, ``fleet_health``, ``pipeline_health``.

They are plain DuckDB views over the stable views (``trajectories``, ``scores``, ``events``,
``dead_letters``), defined on every connection ``open_views`` returns, so ``trajlake sql``,
Dagster metadata and a person's ad-hoc query read the same numbers.

- ``costs``: per day × task family × model × policy version — inference cost (what the agent's
  model calls cost, as recorded), prompt-cache hit rate (cached / input tokens), environment cost
  (sandbox CPU-seconds and memory-GB-seconds × ``TRAJLAKE_PRICE_CPU_SECOND_USD`` /
  ``TRAJLAKE_PRICE_MEMORY_GB_SECOND_USD``; memory-seconds are peak memory × runtime, an upper
  bound), total, cost per exportable trajectory and the inference share of the total.
- ``fleet_health``: per hour of session start — sandbox start latency p50/p95 (sandbox creation
  → first command, recorded by the host in ``session_end.extra``), reaper kills, timeouts and the
  failure causes.
- ``pipeline_health``: per hour of ingest — ingest lag (Kafka took the record → landed in
  ``raw_events``; not event time, which replayed, synthetic and imported runs back-date) p50/p95,
  dead letters by reason, assembly latency (session end → assembled) and scoring latency
  (session end → scored).

Latencies and lags are rounded (seconds to the millisecond, milliseconds to a tenth): they are read
by people; the cost figures are not, since they are summed further.
"""

from __future__ import annotations

import duckdb

from common.settings import Settings

HEALTH_VIEWS = ("costs", "fleet_health", "pipeline_health")

_COSTS = """
CREATE OR REPLACE VIEW costs AS
WITH per_session AS (
    SELECT
        CAST(t.started_at AS DATE) AS day,
        coalesce(t.task_family, t.task_type, '') AS task_family,
        coalesce(t.agent_model, '') AS model,
        coalesce(t.policy_version, '') AS policy_version,
        coalesce(t.cost_usd, 0) AS inference_cost_usd,
        coalesce(t.input_tokens, 0) AS input_tokens,
        coalesce(t.cached_tokens, 0) AS cached_tokens,
        coalesce(t.output_tokens, 0) AS output_tokens,
        coalesce(t.cpu_seconds, 0) AS cpu_seconds,
        coalesce(t.peak_memory_bytes, 0) / 1073741824.0 * coalesce(t.duration_s, 0) AS memory_gb_seconds,
        coalesce(s.exportable, false) AS exportable
    FROM trajectories t LEFT JOIN scores s USING (session_id)
), per_group AS (
    SELECT
        day, task_family, model, policy_version,
        count(*) AS sessions,
        count(*) FILTER (WHERE exportable) AS exportable_sessions,
        sum(inference_cost_usd) AS inference_cost_usd,
        sum(input_tokens) AS input_tokens,
        sum(cached_tokens) AS cached_tokens,
        sum(output_tokens) AS output_tokens,
        sum(cpu_seconds) AS cpu_seconds,
        sum(memory_gb_seconds) AS memory_gb_seconds
    FROM per_session GROUP BY ALL
)
SELECT
    *,
    cached_tokens / nullif(input_tokens, 0) AS prompt_cache_hit_rate,
    cpu_seconds * {cpu_price} + memory_gb_seconds * {memory_price} AS environment_cost_usd,
    inference_cost_usd + cpu_seconds * {cpu_price} + memory_gb_seconds * {memory_price} AS total_cost_usd,
    (inference_cost_usd + cpu_seconds * {cpu_price} + memory_gb_seconds * {memory_price})
        / nullif(exportable_sessions, 0) AS cost_per_exportable_usd,
    inference_cost_usd
        / nullif(inference_cost_usd + cpu_seconds * {cpu_price} + memory_gb_seconds * {memory_price}, 0)
        AS inference_share
FROM per_group
"""

_FLEET_HEALTH = """
CREATE OR REPLACE VIEW fleet_health AS
WITH starts AS (
    SELECT session_id, max(TRY_CAST(extra['first_command_ms'] AS DOUBLE)) AS first_command_ms
    FROM events WHERE event_type = 'session_end' GROUP BY session_id
)
SELECT
    date_trunc('hour', t.started_at) AS hour,
    count(*) AS sessions,
    round(quantile_cont(st.first_command_ms, 0.5) FILTER (WHERE st.first_command_ms > 0), 1) AS start_latency_p50_ms,
    round(quantile_cont(st.first_command_ms, 0.95) FILTER (WHERE st.first_command_ms > 0), 1) AS start_latency_p95_ms,
    count(*) FILTER (WHERE t.exit_reason = 'reaper') AS reaper_kills,
    count(*) FILTER (WHERE t.status = 'timeout') AS timeouts,
    histogram(s.failure_cause) FILTER (WHERE s.failure_cause IS NOT NULL) AS failure_causes
FROM trajectories t
LEFT JOIN scores s USING (session_id)
LEFT JOIN starts st USING (session_id)
GROUP BY 1
"""

_PIPELINE_HEALTH = """
CREATE OR REPLACE VIEW pipeline_health AS
WITH ingest AS (
    SELECT date_trunc('hour', ingested_at) AS hour, count(*) AS events,
           round(quantile_cont(epoch(ingested_at) - epoch(kafka_timestamp), 0.5), 3) AS ingest_lag_p50_s,
           round(quantile_cont(epoch(ingested_at) - epoch(kafka_timestamp), 0.95), 3) AS ingest_lag_p95_s
    FROM events GROUP BY 1
), dead AS (
    SELECT date_trunc('hour', ingested_at) AS hour, count(*) AS dead_letters,
           histogram(reason) AS dead_letters_by_reason
    FROM dead_letters GROUP BY 1
), assembled AS (
    SELECT date_trunc('hour', t.assembled_at) AS hour,
           round(quantile_cont(epoch(t.assembled_at) - epoch(t.ended_at), 0.95), 3) AS assembly_latency_p95_s,
           round(quantile_cont(epoch(s.scored_at) - epoch(t.ended_at), 0.95), 3) AS scoring_latency_p95_s
    FROM trajectories t LEFT JOIN scores s USING (session_id)
    WHERE t.ended_at IS NOT NULL GROUP BY 1
)
SELECT
    hour,
    coalesce(i.events, 0) AS events,
    i.ingest_lag_p50_s, i.ingest_lag_p95_s,
    coalesce(d.dead_letters, 0) AS dead_letters,
    d.dead_letters_by_reason,
    a.assembly_latency_p95_s, a.scoring_latency_p95_s
FROM ingest i FULL JOIN dead d USING (hour) FULL JOIN assembled a USING (hour)
"""


def register_health_views(con: duckdb.DuckDBPyConnection, settings: Settings) -> None:
    """Define ``costs``, ``fleet_health`` and ``pipeline_health`` on ``con`` (which has the base views)."""
    prices = {
        "cpu_price": repr(float(settings.price_cpu_second_usd)),
        "memory_price": repr(float(settings.price_memory_gb_second_usd)),
    }
    for statement in (_COSTS, _FLEET_HEALTH, _PIPELINE_HEALTH):
        con.execute(statement.format(**prices))
