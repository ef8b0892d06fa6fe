"""An export directory as a Hugging Face dataset, replaced as a whole.

Layout (``DIR``)::

    README.md          dataset card: YAML front matter naming the configs, the data file of each
                       split and every column's feature, so ``datasets.load_dataset(DIR)`` needs
                       nothing but the path and never infers a schema from one split alone
    manifest.json      what was selected, left out and written (sha256 of every file)
    data/<split>.jsonl one file per non-empty split (``data/<split>.parquet`` for ``rl --parquet``)
    scores/<split>.jsonl  ``atif`` only: this lake's judgement of each trajectory (config ``scores``)

Features: a column whose values are dicts, or lists of anything but plain numbers or strings, is
declared ``json`` (``datasets.Json``): the loader keeps each record's value as written, instead of
merging every record's keys into one Arrow struct (which gives each tool and argument dict the
other records' keys as nulls, and changes what a chat template renders).

Atomicity: the new export is written whole into a sibling directory ``.<name>.export-<id>.tmp``,
then exchanged with ``DIR`` in one ``renameat2(RENAME_EXCHANGE)`` (where the filesystem lacks it:
two renames, between which ``DIR`` is briefly absent, never mixed). A reader of ``DIR`` sees the
whole earlier export or the whole new one. Exports into one directory take turns under an
``flock`` on its parent. A directory that holds anything but an earlier export is refused unless
``force``; then its other entries are moved into the new export's directory, so they stay in
``DIR`` and the earlier export's files are gone whole. Whatever a killed export left beside
``DIR`` (its staging directory, the exchanged-out earlier export) is cleared by the next export,
which first moves any of the user's entries in it back into ``DIR``.

:func:`checkpoint` names the points a test may kill an export at (``TRAJLAKE_EXPORT_CRASH_AT``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.errors import ExportError
from pipelines.export._files import _refused_directory

if TYPE_CHECKING:
    from warehouse.lakehouse import Locations

#: Environment variable naming a :func:`checkpoint` at which the export process kills itself (tests).
CRASH_ENV = "TRAJLAKE_EXPORT_CRASH_AT"
#: The named points of an export, in order.
CHECKPOINTS = ("data_written", "card_written", "before_swap", "after_swap", "before_cleanup")
#: Entries of an export directory that belong to the export (anything else is the user's).
EXPORT_ENTRIES = frozenset({"README.md", "manifest.json", "data", "scores"})
#: Data files of exports written before the per-split layout (replaced like the export's own).
LEGACY_NAMES = re.compile(r"(hf|openai|sharegpt|rl|atif|verl|skyrl)(\.scores)?\.(jsonl|parquet)")
_STALE = re.compile(r"\.(?P<name>.+)\.export-[0-9a-f]{32}\.(tmp|old)")
_RENAME_EXCHANGE = 2


def checkpoint(point: str) -> None:
    """Kill this process with SIGKILL when ``TRAJLAKE_EXPORT_CRASH_AT`` names ``point`` (crash tests)."""
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _exchange(parent_fd: int, a: str, b: str) -> bool:
    """Swap two names in ``parent_fd`` atomically; False when the system or filesystem cannot."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(parent_fd, a.encode(), parent_fd, b.encode(), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


@dataclass
class Target:
    """An export's directory: its parent (locked), the staging directory being written, what to keep."""

    root: Path
    parent_fd: int
    staging: str
    staging_fd: int
    keep: list[str] = field(default_factory=list)  # the user's entries of DIR carried into the new export
    exists: bool = False

    def close(self) -> None:
        for fd in (self.staging_fd, self.parent_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _own_entries(root: Path) -> set[str] | None:
    """The entries of an earlier export in ``root`` (None when ``root`` holds no readable manifest)."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or "export_id" not in manifest:
        return None
    own = set(EXPORT_ENTRIES)
    for entry in manifest.get("files") or []:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            own.add(entry["path"].split("/", 1)[0])
    return own


def _foreign(root: Path, names: list[str]) -> list[str]:
    """The entries of ``root`` that are not an export's (all of them when it holds no export)."""
    own = (_own_entries(root) or set()) | EXPORT_ENTRIES  # the export's own names are always replaced
    return sorted(n for n in names if n not in own and not LEGACY_NAMES.fullmatch(n))


def _clear_stale(parent_fd: int, parent: Path, name: str) -> None:
    """Remove what killed exports of ``name`` left beside it, moving the user's entries back first."""
    for entry in os.listdir(parent_fd):
        match = _STALE.fullmatch(entry)
        if not match or match["name"] != name:
            continue
        stale = parent / entry
        if (parent / name).is_dir():
            for child in sorted(os.listdir(stale)):
                if child not in EXPORT_ENTRIES and not LEGACY_NAMES.fullmatch(child):
                    if not (parent / name / child).exists():
                        os.rename(stale / child, parent / name / child)
        shutil.rmtree(stale, ignore_errors=True)


def open_target(out_dir: Path | str, places: Locations, force: bool) -> Target:
    """Check ``out_dir``, lock its parent, clear leftovers of killed exports and open a staging directory.

    Raises:
        ExportError: a refused directory, a file, a directory holding something else without ``force``,
            or a parent that cannot be created or opened.
    """
    given = Path(out_dir).expanduser()
    try:
        root = given.resolve(strict=False)
    except (RuntimeError, OSError) as exc:
        raise ExportError(f"--out {given}: cannot resolve the path ({exc})") from None
    why = _refused_directory(root, places)
    if why:
        raise ExportError(f"refusing to export into {root}: {why}")
    if root.exists() and not root.is_dir():
        raise ExportError(f"--out {given}: exists and is not a directory")
    try:
        root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        parent_fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        reason = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise ExportError(f"--out {given}: cannot create or open its parent directory ({reason})") from exc
    try:
        fcntl.flock(parent_fd, fcntl.LOCK_EX)  # a second export beside this one waits for it
        if root.is_symlink():
            raise ExportError(f"--out {given}: is a symlink; name the directory itself")
        _clear_stale(parent_fd, root.parent, root.name)
        names = sorted(os.listdir(root)) if root.is_dir() else []
        foreign = _foreign(root, names) if names else []
        if foreign and not force:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise ExportError(
                f"{root} is not empty and holds something other than an export ({shown}); "
                "choose another directory or pass --force (the export replaces its own files, keeps the rest)"
            )
        staging = f".{root.name}.export-{uuid.uuid4().hex}.tmp"
        os.mkdir(staging, 0o700, dir_fd=parent_fd)
        staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except ExportError:
        os.close(parent_fd)
        raise
    except OSError as exc:
        os.close(parent_fd)
        raise ExportError(f"--out {given}: cannot prepare the export ({exc.strerror or exc})") from exc
    return Target(root, parent_fd, staging, staging_fd, keep=foreign, exists=root.is_dir())


def commit(target: Target) -> None:
    """Put the staged export in place of ``DIR`` as a whole, keeping the user's entries; then drop the earlier one."""
    name, parent_fd = target.root.name, target.parent_fd
    staged = Path(target.root.parent) / target.staging
    os.fsync(target.staging_fd)
    # the user's entries (only with --force) join the new export before it becomes visible
    for child in target.keep:
        os.rename(target.root / child, staged / child)
    checkpoint("before_swap")
    if not target.exists:
        os.rename(target.staging, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        old = None
    else:
        old = target.staging.removesuffix(".tmp") + ".old"
        if _exchange(parent_fd, target.staging, name):
            os.rename(target.staging, old, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        else:  # no atomic exchange here: DIR is briefly absent, never a mix
            os.rename(name, old, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            os.rename(target.staging, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    os.fsync(parent_fd)
    checkpoint("after_swap")
    if old is not None:
        checkpoint("before_cleanup")
        shutil.rmtree(Path(target.root.parent) / old, ignore_errors=True)


def discard(target: Target) -> None:
    """Remove the staging directory of a failed export (the user's entries, if moved, go back first)."""
    staged = Path(target.root.parent) / target.staging
    for child in target.keep:
        if (staged / child).exists() and not (target.root / child).exists():
            os.rename(staged / child, target.root / child)
    shutil.rmtree(staged, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- features


Shape = tuple[Any, ...]
_NULL: Shape = ("null",)
_JSON: Shape = ("json",)
_DTYPES = {"bool": "bool", "int": "int64", "float": "float64", "str": "string"}
#: Deepest nesting declared as typed structs and lists; deeper values are ``json``.
MAX_TYPED_DEPTH = 6


class FeatureSketch:
    """The shape of each column over every record, to declare in the card (one type for every split).

    A value's shape is a scalar, a list of one shape, a struct of fixed keys, or ``json``; shapes of
    records merge (null fits anything, int widens to float, structs merge only with the same keys —
    otherwise the column, or that part of it, is ``json``: each record's value kept as written).
    Typed structs keep numbers exact (the ``json`` decoder does not round-trip every float).
    """

    def __init__(self) -> None:
        self.shapes: dict[str, Shape] = {}

    def add(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            self.shapes[key] = _merge(self.shapes.get(key, _NULL), _shape(value, 0))

    def features(self) -> list[dict[str, Any]]:
        """The ``dataset_info.features`` YAML list (``datasets.Features`` as a card writes it)."""
        return [{"name": key, **_feature(shape)} for key, shape in self.shapes.items()]


def _shape(value: Any, depth: int) -> Shape:
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return ("scalar", "bool")
    if isinstance(value, int):
        return ("scalar", "int")
    if isinstance(value, float):
        return ("scalar", "float")
    if isinstance(value, str):
        return ("scalar", "str")
    if depth >= MAX_TYPED_DEPTH:
        return _JSON
    if isinstance(value, list):
        inner = _NULL
        for item in value:
            inner = _merge(inner, _shape(item, depth + 1))
            if inner == _JSON:
                break
        return ("list", inner)
    if isinstance(value, dict):
        return ("struct", tuple((str(k), _shape(v, depth + 1)) for k, v in value.items()))
    return _JSON


def _merge(a: Shape, b: Shape) -> Shape:
    if a == _NULL or a == b:
        return b
    if b == _NULL:
        return a
    if a[0] == b[0] == "scalar":
        return ("scalar", "float") if {a[1], b[1]} == {"int", "float"} else _JSON
    if a[0] == b[0] == "list":
        return ("list", _merge(a[1], b[1]))
    if a[0] == b[0] == "struct" and [k for k, _ in a[1]] == [k for k, _ in b[1]]:
        return ("struct", tuple((k, _merge(x, y)) for (k, x), (_, y) in zip(a[1], b[1], strict=True)))
    return _JSON


def _feature(shape: Shape) -> dict[str, Any]:
    """One column's (or struct field's) feature as the card's YAML writes it."""
    kind = shape[0]
    if kind == "scalar":
        return {"dtype": _DTYPES[shape[1]]}
    if kind == "null":
        return {"dtype": "string"}
    if kind == "list":
        inner = shape[1]
        if inner[0] == "scalar":
            return {"list": _DTYPES[inner[1]]}
        if inner[0] == "null":
            return {"list": "string"}
        if inner[0] == "struct":
            return {"list": [{"name": k, **_feature(v)} for k, v in inner[1]]}
        return {"list": "json"}  # lists of lists, or of values of no one shape
    if kind == "struct":
        return {"struct": [{"name": k, **_feature(v)} for k, v in shape[1]]} if shape[1] else {"dtype": "json"}
    return {"dtype": "json"}


def _yaml_scalar(value: Any) -> str:
    return (
        json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _yaml(value: Any, indent: int = 0) -> Iterator[str]:
    """A small YAML writer for the card's front matter (dicts, lists, scalars; strings JSON-quoted)."""
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                yield f"{pad}{key}:"
                yield from _yaml(item, indent + 2)
            else:
                yield f"{pad}{key}: {_yaml_scalar(item) if not isinstance(item, dict | list) else '[]'}"
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                lines = list(_yaml(item, indent + 2))
                yield f"{pad}- {lines[0].lstrip()}" if lines else f"{pad}- {{}}"
                yield from lines[1:]
            else:
                yield f"{pad}- {_yaml_scalar(item)}"


def card(
    fmt: str,
    files: dict[str, dict[str, str]],
    features: dict[str, list[dict[str, Any]]],
    counts: dict[str, Any],
    parquet: bool,
) -> str:
    """The dataset card: front matter with the configs, their split files and features; a short body.

    Args:
        fmt: the export format.
        files: config name → split → data file path (only non-empty splits).
        features: config name → the features of its records (omitted for Parquet, which carries its own).
        counts: the manifest's counts (the body says what was left out).
        parquet: whether the data files are Parquet.
    """
    configs = []
    infos = []
    for config, splits in files.items():
        entry: dict[str, Any] = {"config_name": config}
        if config == "default":
            entry["default"] = True
        entry["data_files"] = [{"split": split, "path": path} for split, path in splits.items()]
        configs.append(entry)
        if not parquet and features.get(config):
            infos.append({"config_name": config, "features": features[config]})
    front: dict[str, Any] = {"configs": configs}
    if infos:
        front["dataset_info"] = infos
    front["tags"] = ["trajlake", fmt, "agent-trajectories"]
    lines = ["---", *_yaml(front), "---", ""]
    per_split = counts.get("per_split") or {}
    lines += [
        f"# trajlake export ({fmt})",
        "",
        "Agent trajectories exported by trajlake; `manifest.json` says what was selected, what each rule "
        "left out, and the sha256 of every file.",
        "",
        "| split | sessions |",
        "|---|---|",
        *[f"| {split} | {per_split.get(split, 0)} |" for split in ("train", "validation", "test")],
        "",
        "An empty split has no data file and is not in the configs above.",
        "",
    ]
    return "\n".join(lines)


def read_export(out_dir: Path | str, config: str = "default") -> list[dict[str, Any]]:
    """Every record of an export's ``config`` (JSON lines or Parquet), in the manifest's file order (tests, tools)."""
    root = Path(out_dir)
    manifest = json.loads((root / "manifest.json").read_text())
    records: list[dict[str, Any]] = []
    for entry in manifest["files"]:
        if entry.get("config", "default") != config:
            continue
        path = root / entry["path"]
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            records += pq.read_table(path).to_pylist()
        else:
            records += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return records
