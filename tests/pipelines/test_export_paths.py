"""Where an export may write: refused places, links, loops and leftovers — and a fuzzer over path layouts."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.settings import Settings, load_settings
from pipelines.export import ExportError
from pipelines.export._files import _ExclusiveFile, _open_out_dir, _refused_directory
from warehouse.lakehouse import Locations


@pytest.fixture
def lake(tmp_path: Path) -> Settings:
    return load_settings(home=tmp_path / "home", kafka_bootstrap=None, catalog_uri=None)


def opened(out: Path | str, settings: Settings) -> Path:
    root, fd = _open_out_dir(out, Locations.of(settings))
    os.close(fd)
    return root


def test_a_path_through_a_link_to_the_root_creates_no_top_level_directory(lake: Settings, tmp_path: Path) -> None:
    (tmp_path / "to-root").symlink_to("/")
    name = f"trajlake-export-{uuid.uuid4().hex}"
    with pytest.raises(ExportError, match="new top-level directory"):
        opened(tmp_path / "to-root" / name, lake)
    assert not Path("/", name).exists()


@pytest.mark.parametrize("inside", ["", "hot", "hot/trajlake", "catalog-dir", "exports"])
def test_the_lakehouse_own_directories_are_refused(lake: Settings, inside: str) -> None:
    with pytest.raises(ExportError, match="lakehouse's own directory"):
        opened(lake.home_dir / inside, lake)


def test_a_cold_warehouse_outside_home_is_refused_too(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", cold_warehouse=(tmp_path / "cold").as_uri())
    with pytest.raises(ExportError, match="lakehouse's own directory"):
        opened(tmp_path / "cold" / "x", settings)


def test_the_scheduled_exports_place_is_allowed(lake: Settings) -> None:
    assert opened(lake.home_dir / "exports" / "hf" / "2026-12-01", lake).is_dir()


def test_a_symlink_loop_is_one_clear_error(lake: Settings, tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ExportError, match="--out"):
        opened(tmp_path / "a" / "out", lake)


def test_a_temporary_file_of_a_killed_export_is_removed_by_the_next(lake: Settings, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    killed = _ExclusiveFile(fd, "hf.jsonl")  # what a process killed between create and rename leaves
    killed.handle.write("half a record")
    killed.handle.close()
    os.close(fd)
    (out / "notes.tmp").write_text("not ours")
    assert (out / killed.tmp_name).exists()
    opened(out, lake)
    assert sorted(p.name for p in out.iterdir()) == ["notes.tmp"]


# --- fuzzer: random trees of directories and links, random paths through them -----------------------------

_PARTS = st.sampled_from(["a", "b", "link", "loop", "root", "home", "up", "..", ".", "new"])


@pytest.mark.fuzz
@given(
    links=st.dictionaries(
        st.sampled_from(["link", "loop", "root", "home", "up", "a/link"]),
        st.sampled_from(["/", "ROOT", "HOME", "HOME/hot", "HOME/exports", "LOOP", "..", "a", "/etc", "missing"]),
        max_size=4,
    ),
    data=st.data(),
)
def test_fuzz_an_export_directory_is_refused_or_safe(links: dict[str, str], data: st.DataObject) -> None:
    # paths mostly start at one of the links: that is where the interesting layouts are
    first = st.sampled_from(sorted(links)) if links else _PARTS
    path = [data.draw(first), *data.draw(st.lists(_PARTS, max_size=4))]
    base = Path(tempfile.mkdtemp(prefix="export-paths-")).resolve()
    top_level = set(os.listdir("/"))
    try:
        settings = load_settings(home=base / "home", kafka_bootstrap=None, catalog_uri=None)
        (base / "tree" / "a").mkdir(parents=True)
        (base / "home" / "hot").mkdir(parents=True)
        for name, target in links.items():
            resolved_target = {"ROOT": str(base), "HOME": str(base / "home"), "LOOP": str(base / "tree" / name)}.get(
                target.split("/")[0], target
            )
            if target.startswith("HOME/"):
                resolved_target = str(base / "home" / target.split("/", 1)[1])
            link = base / "tree" / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(resolved_target)
        out = base / "tree" / Path(*path)
        try:
            root, fd = _open_out_dir(out, Locations.of(settings))
        except ExportError:
            return
        os.close(fd)
        assert root.is_dir()
        assert _refused_directory(root, Locations.of(settings)) is None or root.is_relative_to(
            base / "home" / "exports"
        )
        assert not (root.parent == Path("/") and root.name not in top_level)
    finally:
        for name in set(os.listdir("/")) - top_level:  # never expected; remove so one failure does not leak
            shutil.rmtree(Path("/", name), ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    assert set(os.listdir("/")) <= top_level
