"""Where a report may write: what an export may not touch it may not either, and it replaces only a report.

An earlier report's old pages are removed on each run, so a report written over a directory of other
files would delete them; a link planted where a page goes would be written through.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.report import ReportError, write_report
from tests.helpers import sample_events, write_raw
from warehouse.lakehouse import Lakehouse


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = load_settings(home=tmp_path_factory.mktemp("report-paths") / "home", kafka_bootstrap=None)
    write_raw(settings, sample_events(3))
    assemble(Lakehouse.open(settings))
    return settings


def test_a_report_over_other_files_is_refused_and_deletes_nothing(lake: Settings, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sessions").mkdir(parents=True)
    (site / "sessions" / "about.html").write_text("mine")
    (site / "notes.txt").write_text("mine")
    with pytest.raises(ReportError, match="no report"):
        write_report(Lakehouse.open(lake), site)
    assert (site / "sessions" / "about.html").read_text() == "mine"


@pytest.mark.parametrize("where", ["home", "lakehouse", "system"])
def test_a_report_is_refused_where_an_export_is(
    lake: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    home = tmp_path / "user"  # a stand-in $HOME: without the refusal the report would land in it
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    # /proc: a system tree nothing can be written into, should the refusal ever be lost
    target = {"home": home, "lakehouse": lake.home_dir / "hot", "system": Path("/proc/trajlake-report")}[where]
    with pytest.raises(ReportError, match="refusing to write the report"):
        write_report(Lakehouse.open(lake), target)


def test_the_scheduled_places_inside_the_lakehouse_are_allowed(lake: Settings) -> None:
    """The nightly training set writes its report under TRAJLAKE_HOME/reports/<format>/<day> (Dagster)."""
    out = lake.home_dir / "reports" / "hf" / "2026-01-01"
    write_report(Lakehouse.open(lake), out)
    assert (out / "index.html").is_file()
    write_report(Lakehouse.open(lake), out)  # the next run replaces its own report
    with pytest.raises(ReportError, match="refusing to write the report"):
        write_report(Lakehouse.open(lake), lake.home_dir / "reports")  # the directory itself is not a report's place


def test_links_planted_in_a_report_directory_are_never_written_through(lake: Settings, tmp_path: Path) -> None:
    report = tmp_path / "report"
    stats = write_report(Lakehouse.open(lake), report)
    assert stats.pages > 0
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    page = next((report / "sessions").iterdir())
    page.unlink()
    page.symlink_to(victim)  # where a page will be written again
    (report / "index.html").unlink()
    (report / "index.html").symlink_to(victim)
    (report / ".index.html.partial").symlink_to(victim)  # the old temporary name
    write_report(Lakehouse.open(lake), report)
    assert victim.read_text() == "untouched"
    assert not page.is_symlink() and "<html" in page.read_text()
    # a sessions directory that is a link elsewhere is refused, not followed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.html").write_text("mine")
    other = tmp_path / "report2"
    other.mkdir()
    (other / "sessions").symlink_to(elsewhere)
    with pytest.raises(ReportError, match="symlink"):
        write_report(Lakehouse.open(lake), other)
    assert (elsewhere / "keep.html").read_text() == "mine" and os.listdir(elsewhere) == ["keep.html"]
