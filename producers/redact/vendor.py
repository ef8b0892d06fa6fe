"""Layer 2, generic: vendor tokens recognised by structure, not by a list of formats.

Most service tokens are a short label, a separator and random material (``lsv2_pt_…``, ``glsa_…_…``,
``NRAK-…``, ``nvapi-…``, ``dckr_pat_…``, ``sntrys_…``, ``pul-<hex>``), or dotted parts of which one is
long random material (``dp.st.prd.…``, ``<id>.atlasv1.<secret>``, a Discord bot token). A run is judged
by that structure:

- *labelled*: a first part that reads as a label (2–10 lower-case or upper-case letters and digits, not a
  hash or id name such as ``sha256``, ``req``, ``commit``), then a body with a part of 20+ characters of
  mixed letters and digits (or 32+ hexadecimal digits behind a short label);
- *dotted*: two to five dot-separated parts, one of them 20+ characters of mixed upper case, lower case
  and digits (host names are lower case, file names end in a word, versions are numbers).

An unlabelled random run (``H4sIAAAA…``, a base64 blob, a hash) is left to the context layers: without a
label or a telling place it cannot be told from data.
"""

from __future__ import annotations

import functools
import re
import string

# Labels of hashes, ids and ordinary prefixed values, never of a credential.
NOT_TOKEN_PREFIXES = frozenset({
    "sha", "sha1", "sha224", "sha256", "sha384", "sha512", "md5", "blake2b", "blake3", "xxh", "crc", "git", "commit",
    "rev", "build", "id", "uuid", "guid", "hash", "req", "request", "trace", "span", "run", "job", "msg", "evt", "cus",
    "ch", "pi", "in", "test", "sub", "prod", "price", "acct", "file", "img", "image", "chatcmpl", "call", "toolu",
    "resp", "item", "org", "user", "session", "layer", "blob", "cache", "etag", "v1", "v2", "v3", "tx", "block", "asst",
    "thread", "step", "batch", "ft", "model", "snapshot", "tmp", "temp", "pr", "ref", "tag", "main", "release", "node",
    "pod", "deploy", "container", "vol", "subnet", "vpc", "sg", "ami", "igw", "rtb", "eni", "lt", "snap", "project",
    "workspace", "data", "event", "log", "obj", "key", "doc", "page", "app", "conv", "upload", "attempt",
    "digest", "checksum", "object", "version", "revision", "sum", "hmac", "nonce", "salt", "state", "sig", "cid",
    "tree", "parent", "merge", "head", "base", "patch", "diff", "change", "task", "instance", "sample", "seed",
})  # fmt: skip
_LABEL = re.compile(r"[a-z][a-z0-9]{1,9}|[A-Z][A-Z0-9]{1,9}")
_PARTS = re.compile(r"[._-]")
_HEX = frozenset(string.hexdigits)
_EXTENSION = re.compile(r"[a-z]{1,5}\d?")
# Words run together (``PBKDF2PasswordHasher``, ``M2MComplexCircular2A``): a name, not random material.
_IDENTIFIER = re.compile(r"(?:[A-Z]{0,5}[a-z]{2,}|[A-Z]{1,5}|\d{1,4})+")


def _mixed(part: str) -> bool:
    """Random material: 20+ characters with letters and digits, either both cases or many distinct characters."""
    if len(part) < 20:
        return False
    digits = sum(c.isdigit() for c in part)
    upper = sum(c.isupper() for c in part)
    lower = sum(c.islower() for c in part)
    if digits < 2 or upper + lower < 3:
        return False
    if set(part) <= _HEX:
        return False  # a hex digest
    if _IDENTIFIER.fullmatch(part) and sum(1 for _ in re.finditer(r"[a-z]{2,}", part)) * 4 >= len(part) // 3:
        return False  # CamelCase words
    if upper >= 3 and lower >= 3:
        return True
    # one case and digits (base36): digits throughout, no long run of letters (``authorwithevenlongee869``)
    longest_letters = max((len(m) for m in re.findall(r"[A-Za-z]+", part)), default=0)
    return len(set(part)) >= 12 and digits * 6 >= len(part) and longest_letters < 8


@functools.lru_cache(maxsize=1 << 16)
def vendor_token(run: str) -> bool:
    """Whether ``run`` (a maximal run of letters, digits, ``_``, ``-`` and ``.``) reads as a vendor token."""
    run = run.strip("._-")
    if "." in run:
        parts = run.split(".")
        if len(parts) == 2 and _EXTENSION.fullmatch(parts[1]):
            return False  # a file name
        return 2 <= len(parts) <= 6 and any(p.isalnum() and p.isascii() and _mixed(p) for p in parts)
    parts = _PARTS.split(run)
    if len(parts) < 2:
        return False
    label = parts[0]
    if not _LABEL.fullmatch(label) or label.lower() in NOT_TOKEN_PREFIXES or sum(c.isalpha() for c in label) < 2:
        return False
    body = parts[1:]
    while body and _LABEL.fullmatch(body[0]) and len(body[0]) <= 4 and len(body) > 1:
        if body[0].lower() in NOT_TOKEN_PREFIXES:
            return False
        body = body[1:]  # a label of several parts: lin_api_…, dckr_pat_…, lsv2_pt_…
    if any(_mixed(p) for p in body):
        return True
    longest = max(body, key=len)
    # a hex secret behind a short label (pul-<40 hex>, lsv2_pt_<32 hex>_…): not a digest's name
    return (
        len(longest) >= 32
        and set(longest) <= _HEX
        and not longest.isdigit()
        and sum(c.isdigit() for c in longest) >= 4
        and label.islower()
        and (len(label) <= 8 or any(c.isdigit() for c in label))
    )


# A label of capitals glued to its body (``ATATT3xFf…``, ``ATCTT3…``): capitals, a digit, 40+ random characters.
GLUED = re.compile(r"[A-Z]{3,6}[0-9][A-Za-z0-9]{40,}")


def glued_token(run: str) -> bool:
    """Whether ``run`` (a :data:`GLUED` match) has a random body (a base64 blob has ``+``/``/`` and no label)."""
    body = run[run.index(next(c for c in run if c.isdigit())) + 1 :]
    return _mixed(body[:64]) and not run.startswith("AAAA")


# Maximal runs that may be a vendor token: letters, digits, ``_``, ``-`` and ``.``, 20+ characters.
TOKEN_RUN = re.compile(r"(?<![A-Za-z0-9_.-])[A-Za-z0-9][A-Za-z0-9_.-]{19,}")
#: Runs longer than this are judged without the cache (it keeps its keys) and, when their shape already
#: rules them out, without a copy: a 24 MB line of one run is looked at where it is.
MAX_CACHED_RUN = 4096


def vendor_spans(text: str, limit: int = 256) -> list[tuple[int, int]]:
    """The vendor tokens in ``text`` (the first ``limit`` candidate runs are judged)."""
    spans = []
    for count, match in enumerate(TOKEN_RUN.finditer(text)):
        if count >= limit:
            break
        start, end = match.span()
        if _vendor_run(text, start, end) or _glued(text, start, end):
            while end > start and text[end - 1] in "._-":
                end -= 1
            spans.append((start, end))
        elif (named := _file_named_after(text, start, end)) is not None:
            spans.append((start, named))
    return spans


def _file_named_after(text: str, start: int, end: int) -> int | None:
    """Where the token ends in a file named after one (``<token>.json``), or None.

    :func:`vendor_token` reads ``name.ext`` as a file name and lets it be; the name is judged alone here.
    """
    if end - start > MAX_CACHED_RUN:
        return None
    stem, dot, extension = text[start:end].rstrip("._-").rpartition(".")
    if not dot or "." in stem or not _EXTENSION.fullmatch(extension) or len(stem) < 20:
        return None
    return start + len(stem) if vendor_token(stem) or _glued(stem, 0, len(stem)) else None


def _vendor_run(text: str, start: int, end: int) -> bool:
    """:func:`vendor_token` of ``text[start:end]``; a long run is copied only when its shape may be a token's."""
    if end - start <= MAX_CACHED_RUN:
        return vendor_token(text[start:end])
    while start < end and text[start] in "._-":
        start += 1
    while end > start and text[end - 1] in "._-":
        end -= 1
    if text.find(".", start, end) >= 0:
        if text.count(".", start, end) > 5:
            return False  # more than six dotted parts
    else:
        separator = _PARTS.search(text, start, end)
        if separator is None or not _LABEL.fullmatch(text, start, separator.start()):
            return False  # one part, or a first part that is no label
    return bool(vendor_token.__wrapped__(text[start:end]))


def _glued(text: str, start: int, end: int) -> bool:
    """A run of letters and digits only (not part of a base64 blob) that is a glued label and body."""
    if end - start < 44 or not text[start].isupper() or GLUED.fullmatch(text, start, end) is None:
        return False
    if start > 0 and text[start - 1] in "+/=":
        return False
    # the label's digit is within the first 7 characters, and the body is judged on its first 64
    return (end >= len(text) or text[end] not in "+/") and glued_token(text[start : min(end, start + 71)])


def has_vendor_token(text: str) -> bool:
    """Whether ``text`` holds a run that reads as a vendor token."""
    return bool(vendor_spans(text))
