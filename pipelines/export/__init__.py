"""``trajlake export``: chosen trajectories → a training set (hf, openai, sharegpt, rl, atif) plus its manifest.

Selection (:mod:`pipelines.export.select`): ended, an outcome (SFT formats: verified successes;
``rl``: every evaluated policy session; ``atif``: every ended session; ``--outcome`` chooses), no
security flag, best of its duplicate cluster and ``quality ≥ --min-quality``; optionally one day
(the nightly partition), a policy version, a task family, a time range, a split (by task family:
no family in two splits) and complete rollout groups only. The manifest counts what each rule
left out. Records (:mod:`pipelines.export.formats`) are built from the session's recorded
model calls when it has them (exact prompts, tools, reasoning, token ids) and rebuilt from its
steps otherwise (``prompt_source``, :mod:`pipelines.export.conversation`); each carries its
quality, flags (class, severity, weight), down-weighting, group, attempt, policy version and
split. Every text field is redacted again (``producers.redact``) because export is where data
leaves the lakehouse. Files are written only inside the chosen directory; the manifest lists
source snapshot ids, the filters applied, counts per split, scorer version, weights and
governance table, and each file's sha256, and a row goes to the ``exports`` table.

The output directory is a Hugging Face dataset (:mod:`pipelines.export.layout`): a data file per
split under ``data/``, a dataset card ``README.md`` declaring the configs, split files and
features, and ``manifest.json``. System directories (``/``, ``/etc``, ``/usr``, ``$HOME`` itself,
…) are refused, and so is a directory holding anything but an earlier export unless ``force``.
The export is written whole beside the directory and then exchanged with it in one rename, under
an ``flock`` on the parent: a reader sees the earlier export or the new one, never a mix. Every
file is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``) inside the new directory.

A session whose record cannot be built (arguments nested deeper than
:data:`MAX_NESTING`, a record over :data:`MAX_RECORD_BYTES`, a value JSON cannot hold) is left
out, counted in the manifest and recorded in the ``quarantine`` table; the others are exported.
"""

from pipelines.errors import ExportError
from pipelines.export._files import safe_path
from pipelines.export.layout import read_export
from pipelines.export.options import ExportOptions
from pipelines.export.rl import RL_SCHEMA
from pipelines.export.run import (
    EPISODE_FORMATS,
    FORMATS,
    MAX_NESTING,
    MAX_RECORD_BYTES,
    ExportStats,
    export_training_set,
)
from pipelines.export.select import ExportFilters

__all__ = [
    "EPISODE_FORMATS",
    "FORMATS",
    "MAX_NESTING",
    "MAX_RECORD_BYTES",
    "RL_SCHEMA",
    "ExportError",
    "ExportFilters",
    "ExportOptions",
    "ExportStats",
    "export_training_set",
    "read_export",
    "safe_path",
]
