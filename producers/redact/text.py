"""The text pipeline: every layer applied to one string (:func:`redact_text`).

Order: values the host injected (any of their forms), ``NAME=value`` pairs whose name says secret,
private key blocks (their body lines wherever they follow the header: later lines, other quoted strings,
up to the END line), token formats and command lines, then encoded layers: a base64 or hex run that
decodes to text holding a secret is redacted whole (``echo -n $TOKEN | base64``, a Kubernetes secret's
``.dockerconfigjson``), and bare key bodies (three or more lines of 64 base64 characters).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import functools
import re
import string
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import ahocorasick_rs

from producers.redact.context import COMMANDS, CONTEXT_SPECS, PGPASS, command_spans, pgpass_spans
from producers.redact.decode import decode_all, decoded_spans, has_escape
from producers.redact.detector import detector_spans
from producers.redact.formats import REDACTED, RULE_SPECS, RULES, XML_RULE
from producers.redact.names import is_code, literal_is_secret, name_strength
from producers.redact.scan import find_matches
from producers.redact.values import generation, injected_spans, may_hold_injected, merge_spans, replace_spans
from producers.redact.vendor import MAX_CACHED_RUN, has_vendor_token, vendor_spans

# Names that say secret contain one of these; each occurrence anchors a look for ``NAME<sep>value``.
NAME_STEMS = (
    "pass", "pwd", "pw", "secret", "token", "key", "auth", "cred", "sas", "cookie", "salt", "_pat", "jwt", "login",
)  # fmt: skip
# What follows a stem: the rest of the name, the closing quote of a quoted name, an optional type
# (``var apiToken string =``, ``token: String =``), the separator, the value.
_NAME_TAIL = re.compile(
    r"[\w.-]{0,63}(?P<qk>\\*[\"'])?"
    r"(?P<ty>(?(qk)|(?:[ \t]*:[ \t]*[A-Za-z_][\w.]*(?:\[[\w., ]*\])?\??(?=[ \t]*=)"
    r"|[ \t]+(?:string|String|str|SecureString|\[\]byte)(?=[ \t]*:?=))?))"
    r"(?P<sep>(?(qk)(?:\s*(?:=>|[:=])\s*|[ \t]*,[ \t]*(?=\\*[\"']))"
    r"|(?:[ \t]*(?::{0,3}=|[?.+|]=|\?\?=|\|\|=|=>)[ \t]*|:[ \t]+|[ \t]+:[ \t]+)))"
    r"(?P<q>\\*[\"'`])?(?P<s>(?(q)(?:(?!(?P=q))[^\n])*|[^\s'\"`,;&|(){}\[\]<>\\]++(?![(\[])))(?(q)(?P=q))"
)
# Before a name that starts a line: indentation, a YAML list dash, ``export``/``set``/``ENV``.
_LINE_HEAD = re.compile(r"(?:^|\n|\r|\\n|\\r)[ \t]*(?:-[ \t]+)?(?:(?:export|set|setx|ENV|ARG|declare -x)[ \t]+)?\Z")
# The rest of a line, for a line's value (YAML ``password: two words&3``), without a trailing comment.
_REST_OF_LINE = re.compile(r"[^\r\n\\]*(?:\\(?![nrt])[^\r\n\\]*)*")
_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")

# Every rule needs one of these literals, so most strings cost one Aho-Corasick pass.
TRIGGERS: tuple[str, ...] = tuple(sorted({t for triggers, _, _, _ in RULE_SPECS for t in triggers} | set(NAME_STEMS)))
# A command with credential flags, followed by a space (``docker ``, ``zip ``): its words are read (context layer).
COMMAND_TRIGGERS = tuple(sorted(f"{command} " for command in COMMANDS))
LOWER_TRIGGERS = [t for t in TRIGGERS if t == t.lower()] + ["private key"] + list(COMMAND_TRIGGERS)
AUTOMATON = ahocorasick_rs.AhoCorasick(LOWER_TRIGGERS)
LONGEST_TRIGGER = max(len(t) for t in LOWER_TRIGGERS)
_TRIGGER_RULES = [
    frozenset(i for i, (triggers, _, _, _) in enumerate(RULE_SPECS) if t in triggers) for t in LOWER_TRIGGERS
]
_TRIGGER_IS_STEM = [t in NAME_STEMS for t in LOWER_TRIGGERS]
_TRIGGER_IS_KEY_BLOCK = [t == "private key" for t in LOWER_TRIGGERS]
_TRIGGER_IS_COMMAND = [t in COMMAND_TRIGGERS for t in LOWER_TRIGGERS]
CASED_TRIGGERS = [
    (t, frozenset(i for i, (triggers, _, _, _) in enumerate(RULE_SPECS) if t in triggers))
    for t in TRIGGERS
    if t != t.lower()
]

# -- private key blocks ---------------------------------------------------------------------------------------

KEY_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
KEY_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# Body material inside a block: base64 runs (and the hex of an encrypted key's DEK-Info); never a marker.
_KEY_BODY = re.compile(r"(?<![A-Za-z0-9+/=\[])(?!REDACTED\])[A-Za-z0-9+/=]{8,}")
# A bare body: three or more lines of exactly 64 base64 characters (PEM's width), header or not.
_BARE_BODY = re.compile(
    r"(?:(?<![A-Za-z0-9+/=])|(?<=\\[nr]))(?:[A-Za-z0-9+/]{64}[ \t]*(?:\r?\n|\\r\\n|\\n)[ \t]*){2,}"
    r"[A-Za-z0-9+/]{4,64}={0,2}(?![A-Za-z0-9+/=])"
)
_PUBLIC_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*(?:CERTIFICATE|PUBLIC KEY)[A-Z0-9 ]*-----")


def key_block_spans(text: str, open_block: bool = False) -> tuple[list[tuple[int, int]], bool]:
    """Body runs of private key blocks in ``text``, and whether a block is still open at its end.

    Args:
        text: the string.
        open_block: a block opened in an earlier string of the same stream and not yet closed.
    """
    spans: list[tuple[int, int]] = []
    position = 0
    while True:
        if open_block:
            end = KEY_END.search(text, position)
            stop = end.start() if end is not None else len(text)
            spans += [m.span() for m in _KEY_BODY.finditer(text, position, stop)]
            if end is None:
                return spans, True
            position, open_block = end.end(), False
        begin = KEY_BEGIN.search(text, position)
        if begin is None:
            return spans, False
        position, open_block = begin.end(), True


def bare_body_spans(text: str) -> list[tuple[int, int]]:
    """Bare private key bodies (lines of 64 base64 characters) not inside a certificate or public key."""
    spans: list[tuple[int, int]] = []
    position = 0
    for run in _LONG_BASE64.finditer(text):
        start = run.start()
        if start > 0 and text[start - 1] == "\\" and text[start] in "nr":
            start += 1  # the run began with the n of an escaped line break
        if start < position or text[start + 64 : start + 65] not in ("\n", "\r", " ", "\t", "\\"):
            continue  # not a line of exactly 64 characters
        match = _BARE_BODY.match(text, start)
        if match is None:
            continue
        position = match.end()
        begin = text.rfind("-----BEGIN", 0, match.start())
        if begin >= 0 and _PUBLIC_BEGIN.match(text, begin):
            continue  # a certificate or a public key: public by design
        spans.append(match.span())
    return spans


# -- encoded layers ---------------------------------------------------------------------------------------------

# A run that may be encoded: a maximal run of base64/URL-safe characters that is all base64, all URL-safe
# base64 or all hex. Found as maximal runs of the union alphabet first (a plain character class: fast).
_UNION_RUN = re.compile(r"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_=-]{20,}")  # tried at run starts only
_ENCODED_FORM = re.compile(r"[A-Za-z0-9+/]{20,}={0,2}|[A-Za-z0-9_-]{20,}={0,2}|(?:[0-9a-fA-F]{2}){12,}")
_LONG_BASE64 = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{64}")
# Bound on the runs decoded per string (minified code can hold thousands of long words).
MAX_ENCODED_RUNS = 64
# Characters of a long run decoded at a time (a multiple of 4 and of 2: base64 and hex pieces).
DECODE_CHUNK = 1 << 16
MAX_LAYERS = 2
_HEX = re.compile(r"[0-9a-fA-F]+")


def encoded_runs(text: str, limit: int) -> Iterator[re.Match[str]]:
    """The first ``limit`` runs of ``text`` that may be base64, URL-safe base64 or hex (20+ characters)."""
    count = 0
    for match in _UNION_RUN.finditer(text):
        if _ENCODED_FORM.fullmatch(text, match.start(), match.end()):
            yield match
            count += 1
            if count >= limit:
                return


def decode_run(run: str) -> str | None:
    """The printable text a base64 (standard or URL-safe) or hex run encodes, or None."""
    candidates: list[bytes] = []
    if len(run) % 2 == 0 and _HEX.fullmatch(run):
        candidates.append(bytes.fromhex(run))
    else:
        body = run.rstrip("=")
        padded = body + "=" * (-len(body) % 4)
        try:
            if "-" in body or "_" in body:
                candidates.append(base64.urlsafe_b64decode(padded))
            else:
                candidates.append(base64.b64decode(padded, validate=True))
        except (binascii.Error, ValueError):
            return None
    for data in candidates:
        try:
            decoded = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if len(decoded) >= 8 and decoded.replace("\n", "").replace("\t", "").replace("\r", "").isprintable():
            return decoded
    return None


# A vendor token of a format no rule names: a short lower-case prefix, ``_`` or ``-``, a long random body
# (``sntrys_…``, ``dckr_pat_…``, ``lin_api_…``). Hashes and ids with a prefix are left (``sha256-…``, ``req_…``).
_PREFIXED = re.compile(r"(?P<p>[a-z][a-z0-9]{1,9}(?:[_-][a-z0-9]{1,8}){0,2})[_-](?P<b>[A-Za-z0-9]{24,})")
_NOT_TOKEN_PREFIXES = frozenset({
    "sha", "sha1", "sha256", "sha384", "sha512", "md5", "blake2b", "git", "commit", "rev", "build", "id", "uuid",
    "hash", "req", "request", "trace", "span", "run", "job", "msg", "evt", "cus", "ch", "pi", "in", "test", "sub",
    "prod", "price", "acct", "file", "img", "chatcmpl", "call", "toolu", "resp", "item", "org", "user", "session",
})  # fmt: skip


def prefixed_token(run: str) -> bool:
    """Whether ``run`` reads as a vendor token: a known-looking prefix, then a random body with digits."""
    match = _PREFIXED.fullmatch(run)
    if match is None or match.group("p").split("_")[0].split("-")[0] in _NOT_TOKEN_PREFIXES:
        return False
    body = match.group("b")
    digits = sum(c.isdigit() for c in body)
    if digits < 2 or not any(c.isalpha() for c in body) or (digits < len(body) / 12 and len(set(body)) < 20):
        return False  # a camelCase name with a digit in it, not random material
    if all(c in string.hexdigits for c in body):
        return False  # a hex digest with a label
    upper, lower = sum(c.isupper() for c in body), sum(c.islower() for c in body)
    return upper >= 3 and lower >= 3 or len(set(body)) >= 16


@functools.lru_cache(maxsize=1 << 16)  # runs repeat across events (paths, hashes, ids): judge each once
def run_hides_secret(run: str, layer: int, values_generation: int) -> bool:
    """Whether an encoded-looking run is a vendor token or decodes to text with a secret in it.

    ``values_generation`` (:func:`producers.redact.values.generation`) keys the cache: the verdict
    depends on the registered values.
    """
    if prefixed_token(run):
        return True
    decoded = decode_run(run)
    return decoded is not None and _redact(decoded, layer + 1) != decoded


def run_at_hides_secret(text: str, start: int, end: int, layer: int, values_generation: int) -> bool:
    """:func:`run_hides_secret` of ``text[start:end]``; a run longer than ``MAX_CACHED_RUN`` is judged uncached
    and decoded piece by piece (a 24 MB run is neither copied nor kept by the cache, and random bytes stop
    the decoding at their first piece)."""
    if end - start <= MAX_CACHED_RUN:
        return run_hides_secret(text[start:end], layer, values_generation)
    if _PREFIXED.fullmatch(text, start, end) is not None and prefixed_token(text[start:end]):
        return True
    decoded = _decode_long_run(text, start, end)
    return decoded is not None and _redact(decoded, layer + 1) != decoded


def _decode_long_run(text: str, start: int, end: int) -> str | None:
    """:func:`decode_run` of ``text[start:end]``, decoded :data:`DECODE_CHUNK` characters at a time."""
    decode: Callable[[str], bytes]
    stop, pad = end, 0
    if (end - start) % 2 == 0 and _HEX.fullmatch(text, start, end):
        decode = bytes.fromhex
    else:
        while stop > start and text[stop - 1] == "=":
            stop -= 1
        pad = -(stop - start) % 4
        urlsafe = text.find("-", start, stop) >= 0 or text.find("_", start, stop) >= 0
        decode = base64.urlsafe_b64decode if urlsafe else functools.partial(base64.b64decode, validate=True)
    utf8 = codecs.getincrementaldecoder("utf-8")()
    pieces: list[str] = []
    for position in range(start, stop, DECODE_CHUNK):
        last = position + DECODE_CHUNK >= stop
        chunk = text[position : min(position + DECODE_CHUNK, stop)] + ("=" * pad if last else "")
        try:
            decoded = utf8.decode(decode(chunk), final=last)
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        if not decoded.replace("\n", "").replace("\t", "").replace("\r", "").isprintable():
            return None
        pieces.append(decoded)
    whole = "".join(pieces)
    return whole if len(whole) >= 8 else None


def _encoded_spans(text: str, layer: int) -> list[tuple[int, int]]:
    current = generation()
    return [
        m.span()
        for m in encoded_runs(text, MAX_ENCODED_RUNS)
        if run_at_hides_secret(text, m.start(), m.end(), layer, current)
    ]


# -- NAME=value ------------------------------------------------------------------------------------------------


def _name_spans(text: str, stems: list[int]) -> list[tuple[int, int]]:
    """The values of ``NAME=value``, ``name: value``, ``"name": "value"`` … whose name says secret."""
    spans: list[tuple[int, int]] = []
    done = -1
    for stem in sorted(stems):
        if stem < done:
            continue  # a second stem of a name already looked at (auth_token)
        match = _NAME_TAIL.match(text, stem)
        if match is None:
            continue
        start = stem
        while start > 0 and stem - start < 64 and text[start - 1] in _KEY_CHARS:
            start -= 1
        escaped_line = start > 1 and text[start - 1] == "\\" and text[start] in "nrt"
        if escaped_line:
            start += 1  # a name at the start of a JSON-escaped line: "…\nDB_PASS=…"
        opening = match.group("qk")
        if opening is not None:
            if text[max(0, start - len(opening)) : start] != opening:
                continue
        elif not escaped_line and start > 0 and (text[start - 1] == "\\" or text[start - 1] in _KEY_CHARS):
            continue  # inside a longer word or an escape
        done = match.end()
        key = text[start : match.start("qk") if opening is not None else match.start("ty")].strip()
        strength = name_strength(key.lstrip("$@-"))
        if not strength:
            continue
        sep, quoted = match.group("sep").strip(), match.group("q") is not None
        if sep == "," and not re.fullmatch(r"[A-Z][A-Z0-9]*(?:[_-][A-Z0-9]+)+", key):
            continue  # ("API_TOKEN", "…") sets a variable; ('django.contrib.auth', '…') is a list
        value_start, value_end = match.span("s")
        line_value = False
        if not quoted and opening is None and sep == ":" and _LINE_HEAD.search(text, 0, start) is not None:
            line = _REST_OF_LINE.match(text, value_start)  # YAML: the value is the rest of the line
            value_end = line.end() if line is not None else value_end
            comment = text.find(" #", value_start, value_end)
            value_end = comment if comment >= 0 else value_end
            while value_end > value_start and text[value_end - 1] in " \t,;":
                value_end -= 1
            line_value = True
        value = text[value_start:value_end]
        if line_value and is_code(value.split(" ")[0]) and " " not in value:
            continue
        env_style = sep == "=" and key.upper() == key and any(c.isalpha() for c in key)
        if literal_is_secret(strength, value, quoted=quoted, line_value=line_value, env_style=env_style):
            spans.append((value_start, value_end))
            done = max(done, value_end)
    return spans


# -- the pipeline -----------------------------------------------------------------------------------------------


def trigger_matches(text: str, overlapping: bool = False) -> list[tuple[int, int, int]]:
    """(trigger index, start, end) of the trigger words in ``text``, case-insensitively (long texts in windows)."""
    return find_matches(AUTOMATON, text, LONGEST_TRIGGER, lower=True, overlapping=overlapping)


def may_join_secret(text: str) -> bool:
    """The pre-check for two events' boundary (a name in one, its value in the next; a token cut in two):
    trigger words, a vendor-shaped run or a registered value (cheaper than :func:`may_contain_secret`)."""
    if trigger_matches(text) or any(t in text for t, _ in CASED_TRIGGERS):
        return True
    return may_hold_injected(text) or has_vendor_token(text)


def may_contain_secret(text: str) -> bool:
    """A cheap pre-check: False only when no layer can find anything in ``text``."""
    if trigger_matches(text) or any(t in text for t, _ in CASED_TRIGGERS):
        return True
    if may_hold_injected(text):
        return True
    if has_encoded_secret(text) or bool(bare_body_spans(text)) or has_vendor_token(text):
        return True
    if ":" in text and PGPASS.search(text) is not None:
        return True
    if not has_escape(text):
        return False
    decoded = decode_all(text)  # shorter whenever it differs: the recursion ends
    return decoded != text and may_contain_secret(decoded)


def has_encoded_secret(text: str) -> bool:
    """Whether a base64 or hex run in ``text`` decodes to text holding a secret."""
    return bool(_encoded_spans(text, 0))


# The layers (docs/guarantees.md): each can be switched off to measure what the others catch alone.
ALL_LAYERS = frozenset({"values", "formats", "context", "detector"})
_ACTIVE = {"layers": ALL_LAYERS}


def active_layers() -> frozenset[str]:
    """The layers in use (all of them, except inside :func:`only_layers`)."""
    return _ACTIVE["layers"]


@contextlib.contextmanager
def only_layers(layers: Iterable[str]) -> Iterator[None]:
    """Run only ``layers`` (``values``, ``formats``, ``context``, ``detector``) inside the block: a measuring tool, not
    for production (it is process-wide)."""
    previous = _ACTIVE["layers"]
    _ACTIVE["layers"] = frozenset(layers)
    run_hides_secret.cache_clear()
    try:
        yield
    finally:
        _ACTIVE["layers"] = previous
        run_hides_secret.cache_clear()


_FORMAT_RULES = frozenset(range(len(RULE_SPECS) - len(CONTEXT_SPECS)))


@dataclass
class _Triggered:
    """What the trigger words of one text call for: the token-format and context rules to run, where
    secret-naming stems start, whether a private key block or a secret-bearing command may be present."""

    rules: set[int]
    stems: list[int]
    key_block: bool
    command: bool


def _triggered(text: str, open_block: bool, on: frozenset[str]) -> _Triggered:
    """The trigger words of ``text`` (case-insensitive, then cased) and what they call for, limited to the
    layers ``on``."""
    rules: set[int] = set()
    stems: list[int] = []
    key_block = open_block
    command = False
    for index, start, _ in trigger_matches(text, overlapping=True):
        rules |= _TRIGGER_RULES[index]
        if _TRIGGER_IS_STEM[index]:
            stems.append(start)
        key_block = key_block or _TRIGGER_IS_KEY_BLOCK[index]
        command = command or _TRIGGER_IS_COMMAND[index]
    for trigger, indices in CASED_TRIGGERS:
        if trigger in text:
            rules |= indices
    if on != ALL_LAYERS:
        rules = {i for i in rules if ("formats" if i in _FORMAT_RULES else "context") in on}
    return _Triggered(rules, stems, key_block, command)


def _context_spans(
    text: str, found: _Triggered, layer: int, open_block: bool, on: frozenset[str]
) -> list[tuple[int, int]]:
    """Spans to redact that need their surroundings: values of secret names, private key block bodies,
    secret-bearing commands, pgpass lines, and secrets inside escaped (URL-, backslash-encoded) text."""
    context = "context" in on
    spans = _name_spans(text, found.stems) if found.stems and context else []
    if found.key_block and "formats" in on:
        spans += key_block_spans(text, open_block)[0]
    if found.command and context:
        spans += command_spans(text)
    if context:
        spans += pgpass_spans(text)
    if layer <= 1 and has_escape(text):  # twice: a URL-encoded value inside URL-encoded text (%253A)
        spans += decoded_spans(text, lambda decoded: _redact(decoded, layer + 1), may_contain_secret)
    return spans


def _apply_rules(text: str, rules: set[int]) -> str:
    """``text`` with the token-format and context rules ``rules`` applied in their order."""
    for index in sorted(rules):
        pattern, replacement = RULES[index]
        if index == XML_RULE and "</" not in text:
            continue  # an element needs its closing tag
        text = pattern.sub(replacement, text)
    return text


def _redact(text: str, layer: int = 0, open_block: bool = False) -> str:
    """Every layer in turn (see the module's docstring): injected values, what the trigger words call
    for (spans needing context, then the rules), the detector (outermost layer only), encoded runs, bare
    key bodies and vendor tokens."""
    on = _ACTIVE["layers"]
    spans = injected_spans(text) if "values" in on and may_hold_injected(text) else []
    if spans:
        text = replace_spans(text, spans, REDACTED)
    found = _triggered(text, open_block, on)
    spans = _context_spans(text, found, layer, open_block, on)
    if spans:
        text = replace_spans(text, merge_spans(spans), REDACTED)
    text = _apply_rules(text, found.rules)
    if layer == 0 and "detector" in on and (detected := detector_spans(text)):
        text = replace_spans(text, merge_spans(detected), REDACTED)
    if layer < MAX_LAYERS and "formats" in on:
        spans = _encoded_spans(text, layer) + bare_body_spans(text) + vendor_spans(text)
        if spans:
            text = replace_spans(text, merge_spans(spans), REDACTED)
    return text


def redact_text(text: str, open_block: bool = False) -> str:
    """Return ``text`` with every secret-looking span replaced by ``[REDACTED]``.

    Only the secret is replaced (``DB_PASS=[REDACTED]``, ``"password": "[REDACTED]"``), so the
    surrounding text, quotes and JSON escapes stay as they were. Idempotent.

    Args:
        text: the string.
        open_block: a private key block opened earlier in the stream is not closed yet: its body
            lines at the start of ``text`` are redacted.
    """
    return _redact(text, 0, open_block) if text else text
