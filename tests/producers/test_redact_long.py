"""Long texts are redacted without copies of their size, and exactly as before: the windowed search and the
in-place judgements of long runs give what the whole-text versions give (windows made small here, so the
cases are small too)."""

from __future__ import annotations

import base64
import string

import ahocorasick_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.redact import REDACTED, SessionRedactor, redact_value, scan, structured, text, vendor
from producers.redact.scan import find_matches, lower_ascii
from producers.redact.text import AUTOMATON, LONGEST_TRIGGER, decode_run, run_hides_secret

quick = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PATTERNS = ["ab", "abc", "bca", "cab", "b", "aaaa", "caca"]
haystack = st.text("abcA\u212a\u0130 ", max_size=120)


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "WINDOW_CHARS", 7)
    monkeypatch.setattr(scan, "CHUNK_CHARS", 5)


@pytest.mark.parametrize(
    ("kind", "overlapping"),
    [
        (ahocorasick_rs.MATCHKIND_STANDARD, False),
        (ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST, False),
        (ahocorasick_rs.MATCHKIND_STANDARD, True),
    ],
)
@quick
@given(haystack)
def test_windowed_search_finds_exactly_the_whole_texts_matches(
    small_windows: None, kind: ahocorasick_rs.MatchKind, overlapping: bool, hay: str
) -> None:
    automaton = ahocorasick_rs.AhoCorasick(PATTERNS, matchkind=kind)
    longest = max(map(len, PATTERNS))
    for lower in (False, True):
        whole = automaton.find_matches_as_indexes(lower_ascii(hay) if lower else hay, overlapping=overlapping)
        found = find_matches(automaton, hay, longest, lower=lower, overlapping=overlapping)
        assert (sorted(found) if overlapping else found) == (sorted(whole) if overlapping else whole)


def test_a_long_text_costs_no_index_of_its_size() -> None:
    """The automaton's index of a haystack is 8 bytes a character: a long text is searched a window at a time."""
    long = "x" * (4 * scan.WINDOW_CHARS) + "password"
    assert [m[1] for m in find_matches(AUTOMATON, long, LONGEST_TRIGGER, lower=True)] == [4 * scan.WINDOW_CHARS]


@quick
@given(st.binary(min_size=6, max_size=60), st.sampled_from(["b64", "url", "hex", "text"]), st.integers(0, 2))
def test_a_long_run_is_decoded_piece_by_piece_as_it_is_whole(monkeypatch, data: bytes, form: str, pad: int) -> None:
    monkeypatch.setattr(text, "DECODE_CHUNK", 8)
    if form == "text":
        data = data.hex().encode() + b" ok"  # printable: decodes
    run = {
        "b64": base64.b64encode(data).decode(),
        "url": base64.urlsafe_b64encode(data).decode().rstrip("=") + "=" * pad,
        "hex": data.hex(),
        "text": base64.b64encode(data).decode(),
    }[form]
    assert text._decode_long_run(run, 0, len(run)) == decode_run(run)
    framed = f"<{run}>"
    assert text._decode_long_run(framed, 1, len(framed) - 1) == decode_run(run)


def test_long_runs_are_judged_in_place_and_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text, "MAX_CACHED_RUN", 16)
    monkeypatch.setattr(vendor, "MAX_CACHED_RUN", 16)
    secret = "export DB_PASSWORD=hunter2hunter2x"
    runs = [
        base64.b64encode(secret.encode()).decode(),  # decodes to a secret
        base64.b64encode(b"just ordinary words here").decode(),
        "x" * 200,
        "lsv2_pt_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE",  # a vendor token by structure
    ]
    run_hides_secret.cache_clear()
    for run in runs:
        framed = f"= {run} ="
        expected = run_hides_secret.__wrapped__(run, 0, 0)
        assert text.run_at_hides_secret(framed, 2, 2 + len(run), 0, 0) == expected
    assert run_hides_secret.cache_info().currsize == 0
    for run in [*runs, "sk.A1b2C3d4E5f6G7h8I9j0K1l2M3", "ATATT3xFfGF0" + "aB3dE5gH7jK9mN1p" * 4]:
        assert vendor._vendor_run(run, 0, len(run)) == vendor.vendor_token.__wrapped__(run.strip("._-"))
        expected_glued = len(run) >= 44 and vendor.GLUED.fullmatch(run) is not None and vendor.glued_token(run)
        assert vendor._glued(run, 0, len(run)) == bool(expected_glued)


@pytest.mark.parametrize("where", ["start", "window_edge", "end"])
def test_a_secret_in_a_long_output_is_still_redacted(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setattr(structured, "LONG_STRING", 1000)
    monkeypatch.setattr(scan, "WINDOW_CHARS", 512)
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2
    filler = "".join(string.ascii_lowercase[i % 26] + (" " if i % 7 else "\n") for i in range(3000))
    at = {"start": 0, "window_edge": 512 - 10, "end": len(filler)}[where]
    output = filler[:at] + f" token {secret} " + filler[at:]
    event = {"event_type": "env_feedback", "payload": {"output": output, "exit_code": 0}}
    for redacted in (redact_value(event), SessionRedactor().redact_event(event)):
        out = redacted["payload"]["output"]
        assert secret not in out and REDACTED in out
        assert out.replace(REDACTED, "") == output.replace(secret, "")


def test_a_long_clean_output_is_passed_on_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(structured, "LONG_STRING", 1000)
    event = {"event_type": "env_feedback", "payload": {"output": "x" * 5000 + "\nall good\n", "exit_code": 0}}
    assert redact_value(event) is event
