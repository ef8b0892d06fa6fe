"""Benchmark: redaction recall, false positives and cost (``trajlake bench redaction``).

Three redactors on one corpus (``benchmarks.secret_corpus``):

- ``ours``: ``producers.redact`` (injected values, token formats, names that say secret, parsed JSON);
- ``detect-secrets``: Yelp's detector library through its ad-hoc API (``scan_line`` on every line of
  every string, JSON strings parsed and re-serialized as for ours), with all its default plugins, and
  without its two high-entropy plugins (which flag ordinary words in ad-hoc mode);
- ``both``: ours, then detect-secrets without the entropy plugins.

Recall: per kind and overall, the share of (field, secret) placements whose secret no longer occurs
anywhere in the session's events. False positives: ``[REDACTED]`` markers a redactor puts into the
recorded real runs, which hold no secret (each marker is a change to text that was not a secret).
Cost: µs per event on the real runs' events (agent events with code and long outputs) and on
synthetic fleet events (short commands and outputs), each against the same run's baseline of
encoding the event without redaction; also ours through ``SessionRedactor`` (a session's events in
order, what ``SessionEmitter`` does).

Public corpora (``benchmarks.secret_corpus_public``, fetched and cached on first use): recall and
precision on gitleaks' rule examples and the false-positive rate on ordinary code, docs and shell
scripts, each for the *tune* half (what the rules were adjusted on) and the *held-out* half (never
looked at while changing rules).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.carrier_corpus import (
    SHARED_CORPUS_DIR,
    CarrierCorpusUnavailable,
    CarrierFigures,
    load_carrier_corpus,
    measure_carriers,
)
from benchmarks.detectors import detector_figures
from benchmarks.secret_corpus import (
    CONTEXTS,
    FIELDS,
    REAL_RUNS_DIR,
    SecretCase,
    corpus_sessions,
    fake_cases,
    in_context,
    injected_values,
    leaks,
    place,
    real_run_strings,
    real_runs,
    strings_of,
)
from benchmarks.secret_corpus_public import CorpusUnavailable, LabelledText, gitleaks_examples, ordinary_texts
from producers.redact import (
    REDACTED,
    SessionRedactor,
    forget_secret_values,
    redact_session,
    redact_text,
    redact_value,
    register_secret_values,
)
from producers.redact.text import only_layers
from producers.sdk import Event
from producers.session_generator import synthetic_sessions
from schemas.registry import encode_event

# The layers measured alone (docs/guarantees.md), then together without and with the session-level pass.
LAYER_SETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("values", ("values",)),
    ("formats", ("formats",)),
    ("context", ("context",)),
    ("detector", ("detector",)),
)

TextRedactor = Callable[[str], str]
EventRedactor = Callable[[Event], Event]

# The detect-secrets plugins that judge by entropy alone.
_ENTROPY_PLUGINS = ("Base64HighEntropyString", "HexHighEntropyString")


def _detect_secrets_text() -> TextRedactor:
    """A text redactor replacing what detect-secrets' ``scan_line`` reports, line by line."""
    from detect_secrets.core.scan import scan_line

    def redact(text: str) -> str:
        if not text:
            return text
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            found = {s.secret_value for s in scan_line(line) if s.secret_value}
            for secret in sorted(found, key=len, reverse=True):
                line = line.replace(secret, REDACTED)
            lines[i] = line
        return "\n".join(lines)

    return redact


def _walk(value: Any, text: TextRedactor) -> Any:
    """Apply ``text`` to every string leaf; JSON strings are parsed, redacted and re-serialized."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in "{[" and stripped[-1:] in "}]":
            try:
                parsed = json.loads(stripped)
            except ValueError:
                return text(value)
            redacted = _walk(parsed, text)
            return value if redacted == parsed else json.dumps(redacted, ensure_ascii=False)
        return text(value)
    if isinstance(value, dict):
        return {k: _walk(v, text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_walk(v, text) for v in value)
    return value


@dataclass
class MethodResult:
    """One redactor's figures."""

    name: str
    found: dict[str, int] = field(default_factory=dict)  # kind → (field, secret) placements redacted
    total: dict[str, int] = field(default_factory=dict)
    false_positives: int = 0  # [REDACTED] markers put into the real runs' events
    file_false_positives: int = 0  # ... into every string recorded in their files (histories, responses too)
    changed_events: int = 0
    fp_examples: list[str] = field(default_factory=list)
    us_per_event: float | None = None

    @property
    def recall(self) -> float:
        """Share of all placements redacted."""
        return sum(self.found.values()) / max(1, sum(self.total.values()))

    def kind_recall(self, kind: str) -> float:
        """Share of one kind's placements redacted."""
        return self.found.get(kind, 0) / max(1, self.total.get(kind, 0))


@dataclass
class CorpusFigure:
    """Ours on one half of one public corpus."""

    corpus: str
    split: str  # "tune" or "held-out"
    positives: int = 0
    found: int = 0  # positives whose every secret is gone
    negatives: int = 0
    changed: int = 0  # negatives the redactor changed (false positives)
    flagged_positives: int = 0  # positives the redactor changed at all
    examples: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        """Share of positives with no secret left."""
        return self.found / self.positives if self.positives else None

    @property
    def precision(self) -> float | None:
        """Share of the changed examples that held a secret."""
        flagged = self.flagged_positives + self.changed
        return self.flagged_positives / flagged if flagged else None

    @property
    def fp_rate(self) -> float | None:
        """Share of negatives changed."""
        return self.changed / self.negatives if self.negatives else None


def public_corpus_figures(examples: dict[str, list[LabelledText]]) -> list[CorpusFigure]:
    """Recall, precision and false-positive rate of ``redact_text`` per corpus and half."""
    figures = []
    for corpus, items in examples.items():
        for split in ("tune", "held-out"):
            figure = CorpusFigure(corpus, split)
            for item in items:
                if item.held_out != (split == "held-out"):
                    continue
                out = redact_text(item.text)
                if item.positive:
                    figure.positives += 1
                    figure.found += not any(secret in out for secret in item.secrets)
                    figure.flagged_positives += out != item.text
                else:
                    figure.negatives += 1
                    if out != item.text:
                        figure.changed += 1
                        if len(figure.examples) < 3 and split == "tune":
                            figure.examples.append(f"{item.family}: {out[:100]!r}")
            figures.append(figure)
    return figures


def _public_examples() -> tuple[dict[str, list[LabelledText]], list[str]]:
    examples: dict[str, list[LabelledText]] = {}
    notes = []
    for name, load in (("gitleaks", gitleaks_examples), ("ordinary", ordinary_texts)):
        try:
            examples[name] = load()
        except CorpusUnavailable as exc:
            notes.append(f"public corpus {name} unavailable, not measured: {exc}")
    return examples, notes


@dataclass
class RedactionReport:
    """What ``trajlake bench redaction`` prints."""

    kinds: list[str]
    fields: tuple[str, ...]
    real_events: int
    real_strings: int
    methods: list[MethodResult]
    baseline_us_per_event: float
    seconds: float
    synthetic_us_per_event: float = 0.0  # ours on synthetic fleet events (short commands and outputs)
    context_recall: dict[str, float] = field(default_factory=dict)  # ours, the cases in other surroundings
    synthetic_baseline_us: float = 0.0
    skipped: list[str] = field(default_factory=list)
    session_us_per_event: float = 0.0  # ours through SessionRedactor, a session's events in order
    public: list[CorpusFigure] = field(default_factory=list)
    layer_recall: dict[str, float] = field(default_factory=dict)  # ours on the project's corpus, one layer alone
    carriers: list[CarrierFigures] = field(default_factory=list)  # the shared corpus, per layer and together
    carrier_note: str = ""
    detectors: list[str] = field(default_factory=list)  # maintained detector libraries on the carrier corpus

    def summary(self) -> str:
        """A table of recall per kind, then the totals per method."""
        names = [m.name for m in self.methods]
        width = max(len(k) for k in self.kinds) + 2
        lines = [
            f"redaction corpus: {len(self.kinds)} kinds of fake secrets x {len(self.fields)} fields "
            f"({', '.join(self.fields)}); must-not-change side: {self.real_events} events of real runs",
            "recall per kind".ljust(width) + "".join(n.rjust(18) for n in names),
        ]
        for kind in self.kinds:
            lines.append(kind.ljust(width) + "".join(f"{m.kind_recall(kind):18.2f}" for m in self.methods))
        lines.append("recall overall".ljust(width) + "".join(f"{m.recall:18.4f}" for m in self.methods))
        lines.append("FP redactions".ljust(width) + "".join(f"{m.false_positives:18d}" for m in self.methods))
        lines.append("FP in run files".ljust(width) + "".join(f"{m.file_false_positives:18d}" for m in self.methods))
        if self.layer_recall:
            lines.append(
                "ours, one layer alone: "
                + ", ".join(f"{name} {recall:.4f}" for name, recall in self.layer_recall.items())
            )
        if self.carriers or self.carrier_note:
            lines.append(f"carrier corpus {self.carrier_note}")
            lines += [f"  {figure.line()}" for figure in self.carriers]
            overall = self.carriers[-1] if self.carriers else None
            if overall is not None and (overall.leaked or overall.changed_ids):
                lines.append(
                    f"  leaked: {', '.join(overall.leaked) or '-'}; changed: {', '.join(overall.changed_ids) or '-'}"
                )
        lines += [f"  detector {line}" for line in self.detectors]
        if self.context_recall:
            lines.append(
                "ours, the cases in other surroundings: "
                + ", ".join(f"{name} {recall:.2f}" for name, recall in self.context_recall.items())
            )
        lines.append("changed events".ljust(width) + "".join(f"{m.changed_events:18d}" for m in self.methods))
        costs = "".join(f"{m.us_per_event:18.1f}" if m.us_per_event is not None else " " * 18 for m in self.methods)
        lines.append("us/event".ljust(width) + costs)
        ratios = "".join(
            f"{m.us_per_event / self.baseline_us_per_event:17.2f}x" if m.us_per_event is not None else " " * 18
            for m in self.methods
        )
        lines.append("vs encode".ljust(width) + ratios)
        lines.append(f"baseline: encoding one real event without redaction {self.baseline_us_per_event:.1f} us")
        lines.append(
            f"through SessionRedactor (cross-event state): {self.session_us_per_event:.1f} us/event "
            f"({self.session_us_per_event / self.baseline_us_per_event:.2f}x encoding)"
        )
        for f in self.public:
            lines.append(
                f"public {f.corpus:9s} {f.split:8s}: "
                + (f"recall {f.recall:.4f} ({f.found}/{f.positives}) " if f.recall is not None else "")
                + (f"precision {f.precision:.4f} " if f.precision is not None and f.positives else "")
                + (f"FP {f.changed}/{f.negatives} ({f.fp_rate:.4f})" if f.fp_rate is not None else "")
            )
            lines += [f"    e.g. {example}" for example in f.examples]
        lines.append(
            f"synthetic fleet events: ours {self.synthetic_us_per_event:.1f} us/event, encoding "
            f"{self.synthetic_baseline_us:.1f} us ({self.synthetic_us_per_event / self.synthetic_baseline_us:.2f}x)"
        )
        for m in self.methods:
            for example in m.fp_examples[:3]:
                lines.append(f"  {m.name} FP: {example}")
        for reason in self.skipped:
            lines.append(f"  note: {reason[:160]}")
        lines.append(f"({self.seconds:.1f} s)")
        return "\n".join(lines)


def _markers(events: list[Event]) -> int:
    return sum(text.count(REDACTED) for text in strings_of(events))


def _false_positives(result: MethodResult, redactor: EventRedactor, runs: list[list[Event]]) -> None:
    for events in runs:
        for event in events:
            redacted = redactor(event)
            if redacted == event:
                continue
            result.changed_events += 1
            added = _markers([redacted]) - _markers([event])
            result.false_positives += added
            if len(result.fp_examples) < 5:
                for text in strings_of(redacted):
                    at = text.find(REDACTED)
                    if at >= 0:
                        result.fp_examples.append(repr(text[max(0, at - 60) : at + 30]))
                        break


def _recall(result: MethodResult, redactor: EventRedactor, cases: list[SecretCase]) -> None:
    for case, _field, events in corpus_sessions(cases):
        left = leaks(case, [redactor(e) for e in events])
        result.total[case.kind] = result.total.get(case.kind, 0) + len(case.secrets)
        result.found[case.kind] = result.found.get(case.kind, 0) + len(case.secrets) - len(left)


def _per_event_us(redactor: Callable[[Event], object], events: list[Event], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for event in events:
            redactor(event)
        best = min(best, time.perf_counter() - started)
    return best / max(1, len(events)) * 1e6


def _context_recall(cases: list[SecretCase], context: str) -> float:
    """Share of secrets ours removes from the cases wrapped in ``context`` (in a command output)."""
    found = total = 0
    for case in cases:
        wrapped = in_context(case, context)
        events = [redact_value(e) for e in place(wrapped, "output")]
        total += len(wrapped.secrets)
        found += len(wrapped.secrets) - len(leaks(wrapped, events))
    return found / max(1, total)


def _measure(
    name: str,
    redactor: EventRedactor,
    cases: list[SecretCase],
    runs: list[list[Event]],
    timed: list[Event],
    repeats: int,
    file_strings: list[str],
) -> MethodResult:
    result = MethodResult(name)
    _recall(result, redactor, cases)
    _false_positives(result, redactor, runs)
    # each recorded string on its own, as an event field would carry it
    result.file_false_positives = sum(_markers([redactor({"s": s})]) - s.count(REDACTED) for s in file_strings)
    if timed:
        result.us_per_event = _per_event_us(redactor, timed, repeats)
    return result


def _measure_both(
    cached: TextRedactor,
    text: TextRedactor,
    cases: list[SecretCase],
    runs: list[list[Event]],
    sample: list[Event],
    repeats: int,
    file_strings: list[str],
) -> MethodResult:
    """Ours, then detect-secrets (its current settings) on what ours left."""
    both = _measure("ours+ds", lambda e: _walk(redact_value(e), cached), cases, runs, [], repeats, file_strings)
    both.us_per_event = _per_event_us(lambda e: _walk(redact_value(e), text), sample, 1)
    return both


def run_redaction_benchmark(
    seed: int = 0,
    real_root: Path = REAL_RUNS_DIR,
    detect_secrets: bool = True,
    timing_events: int = 300,
    repeats: int = 3,
    public: bool = True,
    carrier_dir: Path = SHARED_CORPUS_DIR,
) -> RedactionReport:
    """Measure recall, false positives and cost of each redactor.

    Args:
        seed: seed of the fake secrets.
        real_root: the recorded real runs (the must-not-change side).
        detect_secrets: also measure the detect-secrets library (slow: it scans line by line).
        timing_events: real events timed for detect-secrets (ours is timed on all of them).
        repeats: timing repetitions (the best is kept).
        public: also measure the public corpora (fetched and cached on first use: minutes).
        carrier_dir: the corpus of texts with their channels (``../shared/data/redaction-corpus``).
    """
    started = time.monotonic()
    cases = fake_cases(seed)
    runs, skipped = real_runs(real_root)
    real_events = [e for events in runs for e in events]
    values = injected_values(cases)
    register_secret_values(values)  # as the fleet does for what it injects into a sandbox
    file_strings = real_run_strings(real_root)
    try:
        contexts = {name: _context_recall(cases, name) for name in CONTEXTS}
        results, notes = _run_methods(cases, runs, real_events, file_strings, detect_secrets, timing_events, repeats)
    finally:
        forget_secret_values(values)
    baseline = _per_event_us(encode_event, real_events, repeats)
    strings = sum(1 for _ in strings_of(real_events))
    synthetic = [e for session in synthetic_sessions(100, seed=seed) for e in session]
    examples, public_notes = _public_examples() if public else ({}, [])
    layer_recall = _layer_recall(cases)
    carriers, carrier_note = carrier_figures(carrier_dir)
    detectors = [f.line() for f in detector_figures(carrier_dir)] if carriers else []
    return RedactionReport(
        kinds=[c.kind for c in cases],
        fields=FIELDS,
        real_events=len(real_events),
        real_strings=strings,
        skipped=skipped + notes + public_notes,
        methods=results,
        baseline_us_per_event=baseline,
        seconds=time.monotonic() - started,
        synthetic_us_per_event=_per_event_us(redact_value, synthetic, repeats),
        synthetic_baseline_us=_per_event_us(encode_event, synthetic, repeats),
        context_recall=contexts,
        session_us_per_event=_session_us(runs, repeats),
        public=public_corpus_figures(examples),
        layer_recall=layer_recall,
        carriers=carriers,
        carrier_note=carrier_note,
        detectors=detectors,
    )


def _layer_recall(cases: list[SecretCase]) -> dict[str, float]:
    """Ours on the project's corpus with one layer alone (the registered values of the fleet included)."""
    values = injected_values(cases)
    register_secret_values(values)
    try:
        out = {}
        for name, layers in LAYER_SETS:
            result = MethodResult(name)
            with only_layers(layers):
                _recall(result, redact_value, cases)
            out[name] = result.recall
        return out
    finally:
        forget_secret_values(values)


def carrier_figures(directory: Path = SHARED_CORPUS_DIR) -> tuple[list[CarrierFigures], str]:
    """The carrier corpus (``../shared/data/redaction-corpus``): each layer alone, all of them event by event,
    and all of them through the session-level pass (what every door runs)."""
    try:
        cases = load_carrier_corpus(directory)
    except CarrierCorpusUnavailable as exc:
        return [], f"not measured: {exc}"
    figures = []
    for name, layers in LAYER_SETS:
        with only_layers(layers):
            figures.append(measure_carriers(f"{name} alone", cases, lambda events: list(redact_session(events))))
    figures.append(measure_carriers("all, per event", cases, lambda events: [redact_value(e) for e in events]))
    figures.append(measure_carriers("all + session", cases, lambda events: list(redact_session(events))))
    secrets = sum(1 for c in cases if c.kind == "secret")
    return figures, f"({directory.name}: {secrets} secrets, {len(cases) - secrets} ordinary texts)"


def _session_us(runs: list[list[Event]], repeats: int) -> float:
    """µs per event of ours through a ``SessionRedactor`` per run (events in order), best of ``repeats``."""
    best = float("inf")
    events = sum(len(run) for run in runs)
    for _ in range(repeats):
        started = time.perf_counter()
        for run in runs:
            redactor = SessionRedactor()
            for event in run:
                redactor.redact_event(event)
        best = min(best, time.perf_counter() - started)
    return best / max(1, events) * 1e6


def _run_methods(
    cases: list[SecretCase],
    runs: list[list[Event]],
    real_events: list[Event],
    file_strings: list[str],
    detect_secrets: bool,
    timing_events: int,
    repeats: int,
) -> tuple[list[MethodResult], list[str]]:
    """Each redactor's figures, and notes on what could not be measured."""
    results = [_measure("ours", redact_value, cases, runs, real_events, repeats, file_strings)]
    notes: list[str] = []
    if detect_secrets:
        try:
            from detect_secrets.settings import default_settings, transient_settings
        except ImportError:
            notes.append("detect-secrets is not installed (pip install detect-secrets): not compared")
            detect_secrets = False
    if detect_secrets:
        with default_settings() as settings:
            plugins = [{"name": name} for name in settings.plugins]
        precise = [p for p in plugins if p["name"] not in _ENTROPY_PLUGINS]
        sample = real_events[:: max(1, len(real_events) // timing_events)]
        for name, used in (("detect-secrets", plugins), ("ds-no-entropy", precise)):
            with transient_settings({"plugins_used": used}):
                text = _detect_secrets_text()
                # corpus sessions and real runs repeat their ordinary strings: scan each once
                cached = functools.lru_cache(maxsize=1 << 16)(text)
                walk = functools.partial(_walk, text=cached)
                results.append(_measure(name, walk, cases, runs, [], repeats, file_strings))
                results[-1].us_per_event = _per_event_us(functools.partial(_walk, text=text), sample, 1)
                if used is precise:
                    results.append(_measure_both(cached, text, cases, runs, sample, repeats, file_strings))
    return results, notes
