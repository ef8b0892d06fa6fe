"""The configuration a run scores with, and what it records in the ``scores`` table's properties.

The ``scores`` commit that ends a run records the trajectories snapshot it covered, the scorer
version, the configuration (digest and manifest) and the watermark (the latest ``assembled_at`` it
covered): the next run starts from them, and an export's manifest reports them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from common.errors import ConfigError
from common.settings import Settings
from quality.config import QualityConfig
from warehouse.lakehouse import Lakehouse
from warehouse.tables import SCORES, TRAJECTORIES
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.score")

SCORED_SNAPSHOT = "trajlake.scored-trajectories-snapshot"
SCORED_VERSION = "trajlake.scorer-version"
SCORED_DIGEST = "trajlake.scoring-config-digest"
SCORED_CONFIG = "trajlake.scoring-config"
#: The latest ``assembled_at`` (µs since the epoch) a run covered.
SCORED_WATERMARK = "trajlake.scored-watermark"


def quality_config(settings: Settings) -> QualityConfig:
    """The quality knobs from settings (governance overrides from ``TRAJLAKE_QUALITY_GOVERNANCE``).

    Raises:
        ConfigError: the weights, thresholds or governance overrides are inconsistent.
    """
    w_c, w_v, w_n = settings.quality_weights
    try:
        return QualityConfig(
            w_completion=w_c,
            w_validity=w_v,
            w_novelty=w_n,
            min_quality=settings.quality_min,
            behavioural_weight=settings.quality_behavioural_weight,
            governance_overrides=dict(settings.quality_governance),
            outlier_z=settings.quality_outlier_z,
            min_profile_sessions=settings.quality_min_profile_sessions,
            dedup_threshold=settings.dedup_threshold,
            dedup_bands=settings.dedup_bands,
            dedup_rows=settings.dedup_rows,
        )
    except ValueError as exc:
        raise ConfigError(f"quality configuration: {exc}") from exc


@dataclass(frozen=True)
class ScoreOptions:
    """What a scoring run reads from the configuration.

    Attributes:
        config: the quality knobs (:func:`quality_config`).
        chunk_sessions: sessions per chunk of a run (``TRAJLAKE_SCORE_CHUNK_SESSIONS``): memory is bounded by it.
        watermark_lag_s: how far behind the latest ``assembled_at`` a run looks again, for other machines'
            clocks (``TRAJLAKE_SCORE_WATERMARK_LAG_S``).
    """

    config: QualityConfig
    chunk_sessions: int = 100_000
    watermark_lag_s: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ScoreOptions:
        """The options the settings give.

        Raises:
            ConfigError: the quality configuration is inconsistent.
        """
        return cls(quality_config(settings), settings.score_chunk_sessions, settings.score_watermark_lag_s)


def scoring_manifest(lake: Lakehouse) -> dict[str, object]:
    """The scoring configuration the current ``scores`` were computed with (for export manifests).

    Falls back to the configuration in force now (the lakehouse's settings) when nothing has been scored yet.
    """
    props = lake.table(SCORES.name).properties
    recorded = props.get(SCORED_CONFIG)
    if recorded:
        try:
            manifest = json.loads(recorded)
            if isinstance(manifest, dict):
                return {**manifest, "digest": props.get(SCORED_DIGEST)}
        except ValueError:
            log.warning("scores table carries an unreadable scoring configuration; reporting the current one")
    config = quality_config(lake.settings)
    return {**config.manifest(), "digest": config.digest()}


def last_run(lake: Lakehouse) -> tuple[dict[str, str], int | None]:
    """What the last run recorded (the ``scores`` table properties) and the current ``trajectories`` snapshot id.

    The snapshot id is None while there are no trajectories.
    """
    snapshot = lake.table(TRAJECTORIES.name).current_snapshot()
    props = lake.table(SCORES.name).properties
    return props, snapshot.snapshot_id if snapshot else None


def commit_scores(
    lake: Lakehouse,
    config: QualityConfig,
    snapshot_id: int | None,
    props: dict[str, str],
    watermark: str | None,
) -> None:
    """Record what the run covered: trajectories snapshot, scorer, configuration, watermark.

    ``props``: the ``scores`` properties the run started from (nothing is committed when they
    already say the same). ``watermark`` None: the recorded one stays.
    """
    covered = {
        SCORED_SNAPSHOT: str(snapshot_id),
        SCORED_VERSION: config.scorer_version,
        SCORED_DIGEST: config.digest(),
        SCORED_CONFIG: json.dumps(config.manifest(), sort_keys=True),
    }
    if watermark is not None:
        covered[SCORED_WATERMARK] = watermark
    if all(props.get(k) == v for k, v in covered.items()):
        return
    table = lake.table(SCORES.name)

    def attempt() -> None:
        table.refresh()
        with transaction(table) as tx:
            tx.set_properties(covered)

    retry_on_conflict("record the scored snapshot", attempt)
