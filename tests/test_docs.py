"""The README and docs/ link only to files and headings that exist (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_FENCE.sub("", path.read_text()))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in links(document):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (document.parent / file_part).resolve() if file_part else document
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved.relative_to(ROOT)}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert broken == []


def test_the_anchor_rule_matches_github() -> None:
    assert anchor("Live agents: bring your own, or an LLM on any OpenAI-compatible endpoint") == (
        "live-agents-bring-your-own-or-an-llm-on-any-openai-compatible-endpoint"
    )
    assert anchor("Dagster: the control plane") == "dagster-the-control-plane"
    assert anchor("Hot and cold: tiering, maintenance, object storage, other engines") == (
        "hot-and-cold-tiering-maintenance-object-storage-other-engines"
    )
