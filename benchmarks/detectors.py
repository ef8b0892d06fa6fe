"""Maintained detector libraries measured on the carrier corpus, each alone and after ours.

CredSweeper (PyPI ``credsweeper``: rules plus an ML filter) and Kingfisher's Python SDK (PyPI
``kingfisher-secret-scanner``, import ``kingfisher_sdk``) are not dependencies of the project: they are
measured when installed (``python -m benchmarks.detectors`` in a venv that has them) and reported as
absent otherwise. A detector *catches* a secret case when a value it reports holds one of the case's
``must_not_appear`` substrings; it *changes* an ordinary case when it reports anything in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.carrier_corpus import SHARED_CORPUS_DIR, CarrierCase, load_carrier_corpus

Finder = Callable[[str], list[str]]


def _credsweeper() -> Finder:
    from credsweeper import CredSweeper
    from credsweeper.file_handler.string_content_provider import StringContentProvider

    sweeper = CredSweeper()

    def find(text: str) -> list[str]:
        found = sweeper.file_scan(StringContentProvider(text.split("\n")))
        return [line.value for candidate in found for line in candidate.line_data_list if line.value]

    return find


def _kingfisher() -> Finder:
    from kingfisher_sdk import Scanner

    scanner = Scanner()

    def find(text: str) -> list[str]:
        return [f.secret for f in scanner.scan(text) if f.visible and f.secret]

    return find


@dataclass
class DetectorFigures:
    """One detector on the corpus."""

    name: str
    caught: int = 0
    secrets: int = 0
    changed: int = 0
    ordinary: int = 0
    missed_by_ours_caught: list[str] = field(default_factory=list)
    us_per_text: float = 0.0
    note: str = ""

    def line(self) -> str:
        """One line of figures."""
        if self.note:
            return f"{self.name:12s} {self.note}"
        return (
            f"{self.name:12s} caught {self.caught}/{self.secrets}, ordinary flagged {self.changed}/{self.ordinary}, "
            f"{self.us_per_text:.0f} us per text; "
            f"catches that ours misses: {', '.join(self.missed_by_ours_caught) or '-'}"
        )


def measure_detector(name: str, find: Finder, cases: list[CarrierCase], ours_missed: set[str]) -> DetectorFigures:
    """Run ``find`` on every case's whole text."""
    figures = DetectorFigures(name)
    started = time.perf_counter()
    for case in cases:
        values = find(case.text)
        if case.kind == "secret":
            figures.secrets += 1
            if any(m in v for v in values for m in case.must_not_appear):
                figures.caught += 1
                if case.id in ours_missed:
                    figures.missed_by_ours_caught.append(case.id)
        else:
            figures.ordinary += 1
            figures.changed += bool(values)
    figures.us_per_text = (time.perf_counter() - started) / max(1, len(cases)) * 1e6
    return figures


def detector_figures(directory: Path = SHARED_CORPUS_DIR) -> list[DetectorFigures]:
    """Each installed detector on the carrier corpus (absent ones are reported as such), and what it catches
    that ours (:func:`producers.redact.redact_text` on the whole text) misses."""
    from producers.redact import redact_text

    cases = load_carrier_corpus(directory)
    ours_missed = {
        c.id for c in cases if c.kind == "secret" and any(m in redact_text(c.text) for m in c.must_not_appear)
    }
    out = []
    for name, build in (("credsweeper", _credsweeper), ("kingfisher", _kingfisher)):
        try:
            find = build()
        except ImportError as exc:
            out.append(DetectorFigures(name, note=f"not installed ({exc.name}): not measured"))
            continue
        out.append(measure_detector(name, find, cases, ours_missed))
    return out


if __name__ == "__main__":
    for figure in detector_figures():
        print(figure.line())
