"""A report for a lakehouse of any size: every session reachable and found by a search, one page each.

The lakehouse holds synthetic fleet sessions (cheaters among them, flagged with evidence) and two
sessions whose ids attack the page names: one whose id is no plain file name (its page is named by
a digest) and one named like that digest's page, as a producer hiding a flagged session's page
behind its own would name it. The report is read in headless Chromium: the search finds sessions
by id, by evidence and by filters, and a flagged session's evidence is on screen without a click.
The scores' arithmetic is checked in SQL over the same lakehouse.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.report import page_name, write_report
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from tests.helpers import write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: An id that is no plain file name (its page is named by a digest) ...
ODD = "tenant/7\u202eexe.txt"
#: ... and one named like the page an earlier trajlake gave it (``s-`` + 32 hex digits of its sha256).
LOOKALIKE = "s-" + hashlib.sha256(ODD.encode()).hexdigest()[:32]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("report-search")
    settings = load_settings(home=root / "home", kafka_bootstrap=None)
    sink = ListSink()
    run_fleet(settings, "synthetic", 120, seed=11, sink=sink, cheat_rate=0.15)
    sessions = list(dict.fromkeys(e["session_id"] for e in sink.events))
    renamed = {sessions[0]: ODD, sessions[1]: LOOKALIKE}
    events = [{**e, "session_id": renamed.get(e["session_id"], e["session_id"])} for e in sink.events]
    write_raw(settings, events)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return {"settings": settings, "root": root}


@given(st.lists(st.text(max_size=40), min_size=2, max_size=6, unique=True))
def test_no_two_session_ids_share_a_page_name(ids: list[str]) -> None:
    names = [page_name(i) for i in ids]
    assert len({n.lower() for n in names}) == len(ids)  # distinct even on a case-insensitive file system
    assert all(re.fullmatch(r"[a-z0-9._-]{1,130}\.html", n) and not n.startswith(".") for n in names)


def test_an_id_named_like_another_ids_page_gets_its_own() -> None:
    assert page_name(ODD) != page_name(LOOKALIKE)
    assert page_name("ABC") != page_name("abc")


@pytest.mark.slow
def test_every_session_has_its_own_page_and_is_in_the_index(lake: dict[str, Any], tmp_path: Path) -> None:
    settings: Settings = lake["settings"]
    stats = write_report(Lakehouse.open(settings), tmp_path / "report", max_pages=10_000)
    pages = sorted((tmp_path / "report" / "sessions").glob("*.html"))
    titles = Counter(re.search(r"<title>session (.*?)</title>", p.read_text()).group(1) for p in pages)  # type: ignore[union-attr]
    assert stats.sessions == stats.pages == len(pages) == len(titles) and set(titles.values()) == {1}
    assert "tenant/7\\u202eexe.txt" in titles and LOOKALIKE in titles  # the bidi control made visible
    shards = "".join(p.read_text() for p in sorted((tmp_path / "report" / "sessions").glob("index-*.js")))
    ids = {row[0] for row in run_query(settings, "SELECT session_id FROM trajectories")[1]}
    assert len(ids) == stats.sessions and all(f'["{i}"' in shards for i in ids if i != ODD)
    assert shards.isascii()


@pytest.mark.slow
def test_a_small_page_budget_still_indexes_every_session(lake: dict[str, Any], tmp_path: Path) -> None:
    stats = write_report(Lakehouse.open(lake["settings"]), tmp_path / "report", max_pages=5)
    shards = "".join(p.read_text() for p in (tmp_path / "report" / "sessions").glob("index-*.js"))
    assert stats.pages == 5 < stats.sessions
    assert len(re.findall(r'\["[^"]*",null,', shards)) == stats.sessions - 5  # the rest: indexed, without a page
    assert len(re.findall(r'\["[^"]*","[^"]*\.html",', shards)) == 5


@pytest.mark.slow
def test_scores_are_their_arithmetic_in_sql(lake: dict[str, Any]) -> None:
    columns, rows = run_query(
        lake["settings"],
        "SELECT s.session_id, abs(s.raw_quality - (s.w_completion * s.completion + s.w_validity * s.validity "
        "+ s.w_novelty * s.novelty)) < 1e-5 AS raw_ok, abs(s.quality - s.raw_quality * s.governance_weight) < 1e-5 "
        "AS quality_ok, s.weight_flag, s.governance_weight, s.flags, s.exportable, s.export_decision, s.outcome, "
        "s.quality, s.min_quality FROM scores s",
    )
    found = [dict(zip(columns, row, strict=True)) for row in rows]
    assert found and all(r["raw_ok"] and r["quality_ok"] for r in found)
    lowered = [r for r in found if r["governance_weight"] < 1]
    assert lowered and all(r["weight_flag"] and r["weight_flag"] in r["flags"].split(",") for r in lowered)
    assert all(r["weight_flag"] is None for r in found if r["governance_weight"] == 1)
    for r in found:
        assert r["export_decision"].startswith("exportable" if r["exportable"] else "not exportable")
        if r["outcome"] != "success":
            assert r["export_decision"] == f"not exportable: outcome {r['outcome']}"
        elif not r["exportable"] and r["quality"] < r["min_quality"]:
            assert "< min_quality" in r["export_decision"] or "security" in r["export_decision"]


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium is not installed")
def test_a_person_searches_the_report_and_reads_a_flagged_sessions_evidence(
    lake: dict[str, Any], tmp_path: Path
) -> None:
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is not installed")
    settings: Settings = lake["settings"]
    report = tmp_path / "report"
    stats = write_report(
        Lakehouse.open(settings), report, max_pages=20
    )  # most sessions are reachable by the index only
    _, rows = run_query(
        settings,
        "SELECT f.session_id, f.flag, json_extract_string(f.evidence, '$.commands[0]') FROM flags f "
        "WHERE f.flag_class <> 'anomaly' AND json_array_length(f.evidence, '$.commands') > 0 "
        "ORDER BY f.session_id LIMIT 1",
    )
    flagged, flag, command = rows[0]
    _, rows = run_query(
        settings, "SELECT session_id FROM trajectories WHERE session_id NOT IN (SELECT session_id FROM flags) "
        "AND session_id NOT LIKE 'tenant%' ORDER BY started_at NULLS FIRST, session_id LIMIT 1",
    )  # fmt: skip
    plain = rows[0][0]
    errors: list[str] = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 1400})
        page.on("pageerror", lambda e: errors.append(str(e)))

        def refuse(route: Any) -> None:  # the report fetches nothing from the network
            errors.append(route.request.url)
            route.abort()

        page.route(re.compile(r"^(?!file:).*"), refuse)
        page.goto((report / "index.html").as_uri())
        status = page.locator("#search-status")
        page.wait_for_function(
            f"document.getElementById('search-status').textContent.startsWith('{stats.sessions} of')"
        )
        assert page.locator("#search-noscript").is_hidden()
        # a search by a part of an id finds that session, linked to its page or with the command that shows it
        page.fill("#q", plain[4:14])
        assert status.inner_text().startswith(f"1 of {stats.sessions} sessions match")
        result = page.locator("#results tbody tr")
        assert result.count() == 1 and plain in result.inner_text()
        # a search by the evidence (the command a flag names) finds the flagged session, evidence in its row
        page.fill("#q", command)
        rows_text = page.locator("#results tbody").inner_text()
        assert flagged in rows_text and command in rows_text
        assert page.locator("#results tr.flagged .evidence-line", has_text=command).first.is_visible()
        # the filters: by flag, then by outcome; every row shown carries the flag
        page.fill("#q", "")
        page.select_option("#f-flag", flag)
        count = int(status.inner_text().split(" of ")[0])
        assert count >= 1 and all(flag in t for t in page.locator("#results tbody tr").all_inner_texts())
        outcome = page.locator("#results tbody tr td").nth(2).inner_text()
        page.select_option("#f-outcome", outcome)
        assert 1 <= int(status.inner_text().split(" of ")[0]) <= count
        # paging through every session: 100 a page, nothing left out
        page.select_option("#f-flag", "")
        page.select_option("#f-outcome", "")
        seen = 0
        while True:
            seen += page.locator("#results tbody tr").count()
            if page.locator("#next").is_disabled():
                break
            page.click("#next")
        assert seen == stats.sessions
        # the most severe flagged session's page shows its evidence on load, ahead of everything else
        page.goto((report / "index.html").as_uri())
        page.locator("#flagged-sessions a.session").first.click()
        page.wait_for_load_state()
        evidence = page.locator(".flag .evidence").first
        assert evidence.is_visible() and "reason" in evidence.inner_text()
        assert page.locator("h2").first.inner_text().startswith("Flags")
        browser.close()
    assert errors == []
