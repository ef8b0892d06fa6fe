"""What an export reads from the configuration: its own small options, read from the settings in one place."""

from __future__ import annotations

from dataclasses import dataclass

from common.settings import Settings


@dataclass(frozen=True)
class ExportOptions:
    """An export's configuration (the rest of what it needs is the lakehouse's).

    Attributes:
        min_quality: the quality threshold of the SFT formats when ``--min-quality`` is not given
            (``TRAJLAKE_QUALITY_MIN``).
        memory_limit: DuckDB memory of the export's query; past it the ordering spills under the
            lakehouse's scratch directory (``TRAJLAKE_EXPORT_MEMORY_LIMIT``).
    """

    min_quality: float = 0.5
    memory_limit: str = "512MB"

    @classmethod
    def from_settings(cls, settings: Settings) -> ExportOptions:
        """The options the settings give."""
        return cls(min_quality=settings.quality_min, memory_limit=settings.export_memory_limit)
