"""Fuzzers of every import format: a real-shaped record with hostile values and shapes at random places.

The property: the import either gives sessions whose every event encodes under ingest's record limit,
or refuses the record with a one-line ``ImportFormatError`` naming the file; never another exception.
Every crash these found became a test in ``test_hostile.py``.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from producers.importers import ImportFormatError, import_file
from schemas.registry import encode_event

FIXTURES = Path(__file__).parent / "fixtures"
# One real-shaped record per format (a JSON Lines fixture: its first line).
RECORDS = {
    "mini-swe-agent-1": ("mini_swe_agent_v1/acme__widgets-101.traj.json", False),
    "mini-swe-agent-2": ("mini_swe_agent_v2/acme__widgets-102/acme__widgets-102.traj.json", False),
    "swe-agent": ("swe_agent/acme__widgets-103/acme__widgets-103.traj", False),
    "enigma": ("swe_agent/enigma_rev_crackme.traj", False),
    "openhands-v0": ("openhands_v0/output.jsonl", True),
    "openhands-v1": ("openhands_v1/acme__widgets-106.events.json", False),
    "atif": ("harbor_job/fix-git__Pq3Lm/agent/trajectory.json", False),
    "otel": ("otel/weather.otlp.json", False),
}

HOSTILE = st.one_of(
    st.sampled_from([1e300, -1e300, math.inf, -math.inf, math.nan, 10**40, -(10**19), 2**63, -1, 0, True, None]),
    st.sampled_from(["", "\ud800", "x\udfff y", "9999-99-99T99:99:99", "+275760-09-13T00:00:00Z", "NaN", "[]", "{"]),
    st.just("i" * (1 << 20)),
    st.text(max_size=30),
    st.sampled_from([[], {}, [None], {"kind": None}, [{"role": 5}], {"text": 7}]),
    st.integers(),
    st.floats(),
)


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON document (keys of objects, indices of arrays)."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:12]):  # long arrays: their first items stand for the rest
            found += _paths(item, (*path, index))
    return found


def _mutate(document: Any, where: tuple, replacement: Any, delete: bool) -> Any:
    replacement = copy.deepcopy(replacement)  # a shared sample inserted twice must not become a cycle
    if not where:
        return replacement
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        parent.pop(where[-1], None)
    elif delete and isinstance(parent, list):
        del parent[where[-1]]
    else:
        parent[where[-1]] = replacement
    return document


def _check(tmp_path: Path, name: str, document: Any, lines: bool) -> None:
    path = tmp_path / (Path(RECORDS[name][0]).name)
    path.write_text(json.dumps(document) + ("\n" if lines else ""))
    try:
        result = import_file(path)
    except ImportFormatError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    for session in result.sessions:
        for event in session.events:
            assert len(encode_event(event)) < 1 << 20
    for item in result.quarantined:
        assert "\n" not in str(item)


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.parametrize("name", sorted(RECORDS))
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    mutations=st.lists(
        st.tuples(st.integers(min_value=0, max_value=10**6), HOSTILE, st.booleans()), min_size=1, max_size=4
    )
)
@example(mutations=[(0, None, False)])  # the whole record replaced: not a run at all
def test_hostile_records_import_or_are_refused_in_one_line(
    tmp_path: Path, name: str, mutations: list[tuple[int, Any, bool]]
) -> None:
    relative, lines = RECORDS[name]
    text = (FIXTURES / relative).read_text()
    document = json.loads(text.splitlines()[0] if lines else text)
    for pick, replacement, delete in mutations:
        places = _paths(document)
        document = _mutate(document, places[pick % len(places)], replacement, delete)
    _check(tmp_path, name, document, lines)


_ids = st.text(alphabet="abcdefgh_-./:0123456789", min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(instance=_ids, cut=st.integers(min_value=0, max_value=29), extra=_ids)
def test_a_verdict_judges_only_its_exact_instance(instance: str, cut: int, extra: str) -> None:
    """A report keyed by a prefix of an instance id, or by a longer id, never judges the instance."""
    from producers.importers.verdicts import instance_alias, parse_verdicts

    prefix = instance[:cut]
    keys = {prefix, instance + extra} - {instance, instance_alias(instance) or ""}
    report = parse_verdicts(Path("report.json"), {"resolved_ids": sorted(keys), "unresolved_ids": []})
    assert report is not None
    assert report.get(instance) is None
    report = parse_verdicts(Path("report.json"), {"resolved_ids": [instance], "unresolved_ids": sorted(keys)})
    assert report is not None
    verdict = report.get(instance)
    assert verdict is not None and verdict.passed


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_REPORTS = [
    lambda v: {"acme__w-1": {"resolved": True, "tests_status": {"FAIL_TO_PASS": {"success": v, "failure": []}}}},
    lambda v: {"acme__w-1": {"resolved": v, "tests_status": v}},
    lambda v: {"resolved_ids": v, "unresolved_ids": ["acme__w-2"]},
    lambda v: {"task_name": "t", "trial_name": "t__x", "verifier_result": {"rewards": v}},
    lambda v: {"acme__w-1": v},
]


@given(value=_JSON, shape=st.integers(0, len(_REPORTS) - 1))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_verdict_file_of_any_shape_is_read_or_refused_in_one_line(tmp_path: Path, value: Any, shape: int) -> None:
    """The probe: a report whose test buckets hold a number (``"success": 5``) raised TypeError out of
    ``trajlake import --verdicts`` (a traceback); every value in every place is read or named in one line."""
    from producers.importers.verdicts import read_verdicts

    path = tmp_path / "report.json"
    path.write_text(json.dumps(_REPORTS[shape](value)))
    found, errors = read_verdicts(path)
    assert all("\n" not in e for e in errors)
    for report in found:
        for verdict in report.verdicts.values():
            assert isinstance(verdict.passed, bool) and math.isfinite(verdict.reward)
            assert verdict.tests_total >= verdict.tests_passed >= 0
