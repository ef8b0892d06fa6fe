"""Layer 3, context: a value is a secret because of where it stands, whatever it looks like.

- **Command lines**: the argument of a credential flag of a known command (``docker login -p``, ``zip -P``,
  ``sqlcmd -P``, ``ssh-keygen -N``, ``gpg --passphrase``, ``openssl -pass pass:…``, ``keytool -storepass``,
  ``ldapsearch -w``, ``smbclient -U user%pass``, ``aws ssm put-parameter --value`` …), the positional
  password of ``htpasswd -b``, ``rabbitmqctl add_user``, ``wpa_passphrase``, ``sqlplus user/pass``, and
  any long option whose *name* says secret (``--apiKey``, ``--db-password``): commands are read as
  words (quotes respected), not as one pattern each.
- **Languages and protocols**: SQL ``IDENTIFIED BY '…'``, ``CREATE/ALTER ROLE|USER|LOGIN … PASSWORD '…'``,
  ``SET PASSWORD … = '…'``; redis ``AUTH [user] pass``, ``requirepass``/``masterauth``; a value fed on
  standard input to a command that reads a secret there (``echo X | docker login --password-stdin``,
  ``… <<< X``, ``echo 'user:pass' | chpasswd``); ``.pgpass`` lines (``host:port:db:user:password``).
- **A word that says secret, then a random value** (``token ATATT3x…``, ``password: Xy9…``): only values
  with the texture of a credential, so prose (``token refreshed for …``) is left.

Values that are references or placeholders (``$PASS``, ``${{ secrets.X }}``, ``<password>``, ``****``,
``env:VAR``, ``file:path``) are never rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from producers.redact.names import REDACTED, is_placeholder, looks_random, name_strength

Replacement = str | Callable[[re.Match[str]], str]


def _keep_or_redact(match: re.Match[str], start: int, end: int) -> str:
    text = match.group(0)
    base = match.start()
    value = match.string[start:end]
    if start >= end or is_placeholder(value) or value.startswith("$"):
        return text
    return text[: start - base] + REDACTED + text[end - base :]


def _value(match: re.Match[str]) -> str:
    return _keep_or_redact(match, *match.span("s"))


def _random_value(match: re.Match[str]) -> str:
    """A value after a space: only redacted when it reads as random material, not a word of prose."""
    value = match.group("s")
    if not looks_random(value) or _ORDINARY_ID.fullmatch(value):
        return match.group(0)
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return match.group(0)  # ``empty/mismatch``: words and punctuation, not random material
    if re.fullmatch(r"[a-z]+(?:[_-][a-z0-9]+)+", value):
        return match.group(0)  # a snake_case or kebab-case name
    return _value(match)


# Hex digests, UUIDs, numbers, versions, dotted names: ids and hashes that travel beside secret words.
_ORDINARY_ID = re.compile(
    r"(?:0x)?[0-9a-fA-F]{6,64}|[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}|[\d.,:_-]+|v?\d+(?:\.\w+)+"
)


# -- command lines ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Command:
    flags: frozenset[str] = frozenset()  # the next word (or ``flag=value``) is the secret
    joined: tuple[str, ...] = ()  # the secret is glued to the flag (``7z -pSECRET``, ``xfreerdp /p:SECRET``)
    split: str = ""  # the secret follows this character inside the value (``user%pass``, ``user,pass``)
    positional: int = 0  # the secret is the n-th positional argument from the end (``htpasswd -b f u PASS``)
    needs: tuple[str, ...] = ()  # the line must hold one of these words (``aws ssm put-parameter``)
    needs_flag: str = ""  # the positional rule applies only with this flag letter (``htpasswd -b``)
    not_ports: bool = False  # a value of digits, dots and colons is a port mapping (``docker run -p 80:80``)


def _c(*flags: str, **kw: object) -> _Command:
    return _Command(flags=frozenset(flags), **kw)  # type: ignore[arg-type]


_P = ("-p", "--password")
COMMANDS: dict[str, _Command] = {
    **dict.fromkeys(
        ("docker", "podman", "buildah", "nerdctl", "oras", "regctl", "skopeo", "helm"),
        _c(*_P, needs=("login", "registry", "repo"), not_ports=True),
    ),
    "twine": _c(*_P, needs=("upload",)),
    **dict.fromkeys(("zip", "unzip", "zipcloak"), _c("-P", "--password")),
    **dict.fromkeys(("7z", "7za", "7zr", "rar", "unrar"), _c(joined=("-p",))),
    **dict.fromkeys(("sqlcmd", "bcp", "osql", "isql", "sybase"), _c("-P")),
    "ssh-keygen": _c("-N", "-P"),
    **dict.fromkeys(("gpg", "gpg2"), _c("--passphrase")),
    **dict.fromkeys(
        ("ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldapwhoami", "ldappasswd", "ldapcompare"),
        _c("-w", "-s"),
    ),
    **dict.fromkeys(("mosquitto_pub", "mosquitto_sub", "mosquitto_rr"), _c("-P", "--pw")),
    **dict.fromkeys(
        ("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport", "mongoimport", "mongostat"), _c(*_P)
    ),
    **dict.fromkeys(
        ("keytool", "jarsigner"),
        _c("-storepass", "-keypass", "-srcstorepass", "-deststorepass", "-srckeypass", "-destkeypass"),
    ),
    **dict.fromkeys(("openssl",), _c("-pass", "-passin", "-passout", "-k", "-password")),
    "aws": _c("--value", "--secret-string", needs=("put-parameter", "put-secret-value", "create-secret")),
    **dict.fromkeys(("smbclient", "rpcclient", "smbcacls", "smbget", "smbtree"), _c("-U", "--user", split="%")),
    **dict.fromkeys(("smbmap", "crackmapexec", "netexec", "nxc", "evil-winrm", "psexec.py", "wmiexec.py"), _c(*_P)),
    "lftp": _c("-u", "--user", split=","),
    "xfreerdp": _c(joined=("/p:",)),
    "rdesktop": _c("-p"),
    "influx": _c("-password", "--password"),
    "useradd": _c(*_P),
    "usermod": _c(*_P),
    "az": _c(*_P),
    "mysqladmin": _c(joined=("-p",)),
    "pg_ctl": _c(),
    "sshpass": _c("-p"),
    "redis-cli": _c("-a", "--pass", "--askpass"),
    "htpasswd": _c(positional=1, needs_flag="b"),
    "rabbitmqctl": _c(positional=1, needs=("add_user", "change_password", "authenticate_user")),
    "wpa_passphrase": _c(positional=1),
    "vault": _c(positional=1, needs=("login",)),
}
# A command, possibly behind a path or ``sudo``, then its arguments up to the end of the command.
_COMMAND_NAMES = "|".join(re.escape(c) for c in sorted(COMMANDS, key=len)[::-1])
_COMMAND = re.compile(
    r"(?:(?<=[\s;|&(`'\"$>])|^)(?:[\w./~-]*/)?(?P<cmd>"
    + _COMMAND_NAMES
    + r")(?=[ \t])(?P<args>(?:[^\n;&|\\]|\\\n|\\(?!\n))*)",
    re.M,
)
_WORD = re.compile(r"'(?P<a>[^']*)'|\"(?P<b>(?:[^\"\\]|\\.)*)\"|(?P<c>[^\s'\"]+(?:['\"][^'\"\s]*['\"][^\s'\"]*)*)")
# openssl's and friends' password arguments: ``pass:SECRET`` is the secret, ``env:``/``file:``/``fd:`` point at it
_PASS_SOURCE = re.compile(r"(?:env|file|fd|stdin|keychain):?")


def _words(args: str, offset: int) -> list[tuple[str, int, int]]:
    """The words of a command's arguments: (text without quotes, start, end) of the unquoted text."""
    words = []
    for m in _WORD.finditer(args):
        group = "a" if m.group("a") is not None else "b" if m.group("b") is not None else "c"
        words.append((m.group(group), m.start(group) + offset, m.end(group) + offset))
    return words


def _secret_in(word: str, start: int, spec: _Command, flag: str) -> tuple[int, int] | None:
    """The span of the secret inside a flag's value ``word`` (at ``start``)."""
    if flag in ("-pass", "-passin", "-passout", "-password") or word.startswith("pass:"):
        if word.startswith("pass:"):
            return start + 5, start + len(word)
        if _PASS_SOURCE.match(word) or word == "stdin":
            return None
    if spec.split:
        cut = word.find(spec.split)
        if cut < 0:
            return None
        return start + cut + 1, start + len(word)
    return start, start + len(word)


def command_spans(text: str) -> list[tuple[int, int]]:
    """The secrets on the command lines in ``text`` (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    for m in _COMMAND.finditer(text):
        spec = COMMANDS[m.group("cmd")]
        words = _words(m.group("args"), m.start("args"))
        values = [w for w, _, _ in words]
        if spec.needs and not any(n in values for n in spec.needs):
            continue
        positional: list[tuple[str, int, int]] = []
        flag_letters = ""
        skip = False
        for index, (word, start, end) in enumerate(words):
            if skip:
                skip = False
                continue
            found: tuple[int, int] | None = None
            if word in spec.flags and index + 1 < len(words):
                nxt, nstart, _ = words[index + 1]
                found = _secret_in(nxt, nstart, spec, word)
                skip = True
            elif "=" in word and word.split("=", 1)[0] in spec.flags:
                flag, value = word.split("=", 1)
                found = _secret_in(value, start + len(flag) + 1, spec, flag)
            else:
                for glued in spec.joined:
                    if word.startswith(glued) and len(word) > len(glued):
                        found = (start + len(glued), end)
                if word.startswith("-") and len(word) > 1:
                    flag_letters += word.lstrip("-")
                elif found is None:
                    positional.append((word, start, end))
            if found is not None and not (spec.not_ports and re.fullmatch(r"[\d:.]+", text[found[0] : found[1]])):
                spans.append(found)
        if spec.positional and len(positional) >= 2 and (not spec.needs_flag or spec.needs_flag in flag_letters):
            word, start, end = positional[-spec.positional]
            spans.append((start, end))
    return [(s, e) for s, e in spans if e > s and not _skip_value(text[s:e])]


def _skip_value(value: str) -> bool:
    return value.startswith("$") or value.startswith("%") or is_placeholder(value)


def _named_flag(match: re.Match[str]) -> str:
    """``--NAME value`` / ``--NAME=value`` of any command, where NAME says secret (``--apiKey``, ``--db-password``)."""
    if name_strength(match.group("n")) != 2:
        return match.group(0)
    if match.group("eq") is None and match.group("q") == "" and not looks_random(match.group("s")):
        return match.group(0)  # ``--password suffers from …``: prose, unless the word is random material
    return _value(match)


def _stdin_secret(match: re.Match[str]) -> str:
    return _value(match)


# -- rules ------------------------------------------------------------------------------------------------------

_Q = r"(?P<q>['\"`]?)"
_QV = r"(?P<q>['\"])(?P<s>[^'\"\n]{1,200})(?P=q)"
# Commands that read a secret from standard input.
_READS_SECRET = (
    r"(?:--password-stdin|--token-stdin|--passphrase-stdin|--with-token|--passphrase-fd[ =]0|chpasswd|"
    r"passwd\s+--stdin|\bsudo\s+(?:-\w+\s+)*-S\b|--passin\s+stdin|--api-key-stdin)"
)

# (literal triggers; pattern; replacement; flags) — the same shape as the token formats' rules.
CONTEXT_SPECS: list[tuple[tuple[str, ...], str, Replacement, int]] = [
    # SQL
    (("identified",),
     r"(?i)\bIDENTIFIED\s+(?:WITH\s+\w+\s+)?(?:BY|AS)\s+(?:PASSWORD\s*\(\s*)?" + _QV, _value, 0),
    (("password",),
     r"(?i)\b(?:CREATE|ALTER)\s+(?:ROLE|USER|LOGIN|GROUP)\b[^;\n]{0,200}?\b(?:(?:UN)?ENCRYPTED\s+)?PASSWORD\s*(?:=\s*)?"
     r"(?:PASSWORD\s*\(\s*)?" + _QV, _value, 0),
    (("password",), r"(?i)\bSET\s+PASSWORD\b[^;\n=]{0,120}=\s*(?:PASSWORD\s*\(\s*)?" + _QV, _value, 0),
    # redis
    (("auth",),
     r"(?im)(?:^|>[ \t]*|\bredis-cli\b[^\n]*?[ \t]|\bsend_command\(\s*['\"])AUTH[ \t]+(?:[^\s'\"]+[ \t]+)?"
     + _Q + r"(?P<s>[^\s'\"]{4,})(?P=q)[ \t]*(?:['\"]\s*\)|$)", _random_value, 0),
    (("requirepass", "masterauth", "masterpass"),
     r"(?i)\b(?:requirepass|masterauth|masterpass)\b[ \t]+" + _Q + r"(?P<s>[^\s'\"]+)(?P=q)", _value, 0),
    # a secret fed on standard input
    (("stdin", "--with-token", "chpasswd", "passphrase-fd", "sudo"),
     r"\b(?:echo|printf)(?:\s+-[neE]+)*\s+" + _Q + r"(?:[^\s'\"|:]*:)?(?P<s>[^\s'\"|]{4,})(?P=q)(?:\\n)?['\"]?\s*\|"
     r"[^\n|;&]*" + _READS_SECRET, _stdin_secret, 0),
    (("stdin", "--with-token", "chpasswd", "passphrase-fd"),
     _READS_SECRET + r"[^\n|;&<]*<<<\s*" + _Q + r"(?P<s>[^\s'\"]{4,})(?P=q)", _stdin_secret, 0),
    # sqlplus user/password@db, the password of a connect string
    (("sqlplus", "connect "),
     r"(?i)\b(?:sqlplus|rman|expdp|impdp|exp|imp|connect)\s+(?:-\w+\s+)*[\"']?[\w$#]+/(?P<s>[^\s@/\"']+)@",
     _value, 0),
    # nmcli … password X, wifi-sec.psk X
    (("nmcli",), r"\bnmcli\b[^\n]*?\s(?:password|wifi-sec\.psk|802-1x\.password)\s+" + _Q
     + r"(?P<s>[^\s'\"]+)(?P=q)", _value, 0),
    # Windows: net use \\srv\share /user:NAME PASS, net user NAME PASS /add, cmdkey /pass:PASS
    (("net use", "net user"),
     r"(?i)\bnet\s+(?:use\b[^\n]*?/u(?:ser)?:\S+|user\s+(?!/)\S+)\s+" + _Q + r"(?P<s>[^\s/*'\"]{4,})(?P=q)",
     _value, 0),
    (("/pass:",), r"(?i)(?<![\w-])/pass:" + _Q + r"(?P<s>[^\s'\"]+)(?P=q)", _value, 0),
    # --NAME value for any command
    (("pass", "pwd", "secret", "token", "key", "auth", "cred"),
     r"(?<![\w-])--?(?P<n>[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+){0,4})(?:(?P<eq>=)|[ \t]+)" + _Q
     + r"(?P<s>[^\s'\"]{4,})(?P=q)", _named_flag, 0),
    # a word that says secret, then (after a space or a colon) a value with a credential's texture
    (("token", "password", "passwd", "passphrase", "secret", "apikey", "api key", "api-key", "api_key"),
     r"(?i)(?:token|password|passwd|passphrase|secret|api[ _-]?key|apikey)(?![\w-])[ \t]*:?[ \t]+"
     r"(?!(?:is|was|for|the|a|an|to|of|and|or|in|on|with|from|not|has|have)\b)"
     + _Q + r"(?P<s>[A-Za-z0-9][A-Za-z0-9_.+/=~-]{11,})(?P=q)(?![\w(])", _random_value, 0),
]  # fmt: skip

# ``.pgpass`` (and ``PGPASSFILE``) lines: ``host:port:database:user:password`` (``*`` for any port).
PGPASS = re.compile(r"(?m)^[ \t]*[A-Za-z0-9_.*\[\]-]+:(?:\d{1,5}|\*):[^\s:]+:[^\s:]+:(?P<s>\S+?)[ \t]*$")


def pgpass_spans(text: str) -> list[tuple[int, int]]:
    """The passwords of ``.pgpass`` lines in ``text``."""
    if ":" not in text:
        return []
    return [m.span("s") for m in PGPASS.finditer(text) if not _skip_value(m.group("s")) and ":" not in m.group("s")]


def context_spans(text: str) -> list[tuple[int, int]]:
    """Command-line and ``.pgpass`` secrets in ``text`` (the rules in ``CONTEXT_SPECS`` run with the others)."""
    return command_spans(text) + pgpass_spans(text)
