"""Layer 2b: a maintained detector library, Kingfisher (PyPI ``kingfisher-secret-scanner``, Rust rules).

Its rule catalog is maintained upstream (hundreds of provider formats), so a provider format this
project names nowhere is still found. It runs only on *candidate* strings — those the cheap
pre-check of :func:`producers.redact.text.may_contain_secret` lets through (a trigger word, a
token-shaped or encoded run, an escape) — so ordinary events never pay for it. Every value it reports
(a placeholder excepted) is replaced wherever it occurs in the string.

Measured (docs/guarantees.md): on the recorded real runs' 8,036 candidate strings it reports nothing
(38 µs each); on gitleaks' held-out rule examples it finds 86 of the 95 secrets the other layers miss.
When the package is absent (a stripped-down install) the layer is off and says so once in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from producers.redact.names import is_placeholder, looks_random

log = logging.getLogger(__name__)

# Values shorter than this are not replaced (a short capture would match ordinary text elsewhere).
MIN_DETECTED_LEN = 8
# Strings longer than this are not handed to the detector (the other layers still run on them).
MAX_DETECTOR_CHARS = 1 << 18

_lock = threading.Lock()
_state: dict[str, Any] = {"scanner": None, "failed": False}


def _scanner() -> Any:
    scanner = _state["scanner"]
    if scanner is not None or _state["failed"]:
        return scanner
    with _lock:
        if _state["scanner"] is None and not _state["failed"]:
            try:
                from kingfisher_sdk import Scanner
            except ImportError:
                _state["failed"] = True
                log.warning("kingfisher-secret-scanner is not installed: the detector layer of redaction is off")
                return None
            _state["scanner"] = Scanner()
    return _state["scanner"]


def detector_values(text: str) -> list[str]:
    """The secret values the detector reports in ``text`` (placeholders and short captures left out)."""
    if not text or len(text) > MAX_DETECTOR_CHARS:
        return []
    scanner = _scanner()
    if scanner is None:
        return []
    with _lock:  # one scanner, compiled once; its thread safety is not documented
        findings = scanner.scan(text)
    values = {f.secret for f in findings if f.visible and isinstance(f.secret, str)}
    # a capture that is a word (``password``) or a placeholder is a pattern's accident, not a credential
    return [v for v in values if len(v) >= MIN_DETECTED_LEN and not is_placeholder(v) and looks_random(v)]


def detector_spans(text: str) -> list[tuple[int, int]]:
    """Where the values the detector reports occur in ``text``."""
    spans = []
    for value in detector_values(text):
        start = text.find(value)
        while start >= 0:
            spans.append((start, start + len(value)))
            start = text.find(value, start + len(value))
    return spans
