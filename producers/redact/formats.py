"""Layer 2: secrets recognised by their shape or by the command, header or URL they sit in.

Each rule is a regular expression with a named group ``s`` (the secret), behind literal triggers: a rule
runs on a string only when one of its triggers occurs in it (one Aho-Corasick pass decides). Lower-case
triggers are looked for in the lower-cased text, others (``SK``, ``AC``) as they are. Whatever a rule
captures is left alone when it is a reference or a placeholder (``$P``, ``${NPM_TOKEN}``, ``TOKEN``,
``password``, ``ghp_xxxx…``): see :mod:`producers.redact.names`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable

from producers.redact.context import CONTEXT_SPECS
from producers.redact.names import REDACTED, is_placeholder, literal_is_secret, looks_random, name_strength

Replacement = str | Callable[[re.Match[str]], str]


def _secret_group(match: re.Match[str], group: str = "s", shaped: bool = False) -> str:
    """Replace only the group ``group`` (the secret) inside the match, unless it is a placeholder."""
    start, end = match.span(group)
    if start < 0 or is_placeholder(match.group(group), shaped):
        return match.group(0)
    base = match.start()
    text = match.group(0)
    return text[: start - base] + REDACTED + text[end - base :]


def _basic_credentials(match: re.Match[str]) -> str:
    # "Basic <b64>" outside an Authorization header is a credential only when it decodes to user:password.
    token = match.group("s")
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return match.group(0)
    return _secret_group(match) if ":" in decoded and decoded.isprintable() else match.group(0)


def _shaped(match: re.Match[str]) -> str:
    return _secret_group(match, shaped=True)


def _random_group(match: re.Match[str]) -> str:
    return _secret_group(match) if looks_random(match.group("s")) else match.group(0)


def _url_password(match: re.Match[str]) -> str:
    secret = match.group("s")
    if re.fullmatch(r"\d{1,5}(?:/.*)?", secret):
        return match.group(0)  # host:port/path@…, not user:password@
    return _secret_group(match)


def _option_value(match: re.Match[str]) -> str:
    # ``--password VALUE``: after a space an unquoted word is prose (``--password suffers from …``) unless random
    if match.group("q2") == "" and not looks_random(match.group("s")):
        return match.group(0)
    return _secret_group(match)


def _not_port(match: re.Match[str]) -> str:
    # ``-p3306:3306`` publishes a port (docker), it is not ``mysql -pPASSWORD``
    return match.group(0) if re.fullmatch(r"[\d:.]+", match.group("s")) else _secret_group(match)


def _named_setting(match: re.Match[str]) -> str:
    """``aws configure set NAME VALUE``, ``<NameToken>VALUE</NameToken>``: the name decides."""
    name = re.split(r"[.:/]", match.group("n"))[-1]
    strength = name_strength(name)
    value = match.group("s")
    if literal_is_secret(strength, value, quoted=True, line_value=True, env_style=False):
        return _secret_group(match)
    return match.group(0)


_COOKIE_ATTRIBUTES = frozenset({"path", "domain", "expires", "max-age", "samesite", "secure", "httponly", "version"})
_COOKIE_PAIR = re.compile(r"(?P<n>[^\s=;,]+)=(?P<s>[^;\s\"'\\]+)")


def _cookies(match: re.Match[str]) -> str:
    """Every cookie value that looks like a credential in a ``Cookie:``/``Set-Cookie:`` header or ``--cookie``."""
    text = match.group(0)
    start, _ = match.span("c")
    base = match.start()
    head, body = text[: start - base], text[start - base :]

    def one(pair: re.Match[str]) -> str:
        name, value = pair.group("n"), pair.group("s")
        if name.lower() in _COOKIE_ATTRIBUTES or is_placeholder(value):
            return pair.group(0)
        if looks_random(value) or len(value) >= 16 or name_strength(name):
            return f"{name}={REDACTED}"
        return pair.group(0)

    return head + _COOKIE_PAIR.sub(one, body)


_B64 = r"[A-Za-z0-9+/]"
# Token formats start at a word boundary, or right after an escaped newline or tab ("…\\nghp_…" in JSON text).
_AT = r"(?:\b|(?<=\\[nrt]))"
_TOK = r"[A-Za-z0-9_-]"

# (literal triggers; pattern; replacement; flags).
RULE_SPECS: list[tuple[tuple[str, ...], str, Replacement, int]] = [
    # Authorization headers: whatever follows the scheme is the credential.
    (("authorization", "proxy-authorization"),
     r"(?i)\b(?:proxy-)?authorization\\*[\"']?\s*[:=]\s*\\*[\"']?"
     r"(?:(?>[a-z][\w-]{1,20}[ \t]+)(?=\S)|(?![a-z][\w-]{1,20}[ \t]+\S))"
     r"(?P<s>[^\s\"'\\,;]{4,})", _secret_group, 0),
    (("bearer",), r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]{8,})", _random_group, 0),
    (("basic",), r"(?i)\bbasic\s+(?P<s>[A-Za-z0-9+/]{8,}={0,2})", _basic_credentials, 0),
    (("cookie",),
     r"(?i)(?:\b(?:set-)?cookie\\*[\"']?\s*:|(?:^|\s)(?:-b|--cookie)(?:\s+|=)\\*[\"']?|\bdocument\.cookie\s*=\s*\\*"
     r"[\"'`]?)[ \t]*(?P<c>[^\r\n\"'`]*)", _cookies, re.M),
    # URL credentials (scheme://user:pw@host, redis://:pw@host) and secret query parameters.
    (("://",), r"(?i)\b[a-z][a-z0-9+.-]*://[^\s:/@\"'<>]*:(?P<s>[^\s@\"'<>]+)@(?=[\w\[])", _url_password, 0),
    (("sig=", "signature=", "token=", "key=", "secret=", "password=", "credential="),
     r"(?i)[?&;](?:sig|signature|x-amz-signature|x-amz-security-token|x-amz-credential|access_token|"
     r"refresh_token|id_token|token|api_key|apikey|key|client_secret|secret|password|code|auth)=(?P<s>[^&#\s\"'<>]+)",
     _random_group, 0),
    (("hooks.slack.com",), r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9_/-]{8,})",
     _secret_group, 0),
    (("/api/webhooks/",), r"(?i)discord(?:app)?\.com/api/webhooks/(?P<s>[0-9]+/[A-Za-z0-9_-]+)", _secret_group, 0),
    (("/bot",), r"(?i)api\.telegram\.org/bot(?P<s>\d+:[A-Za-z0-9_-]{20,})", _secret_group, 0),
    # Command-line credentials.
    (("curl",),
     r"\bcurl\b(?:[^\n|;&]|\\\n)*?\s(?:-u|--user)(?:\s+|=)?[\"']?[^\s:\"']*:(?P<s>[^\s\"']+)", _secret_group, 0),
    (("mysql",), r"\bmysql(?:dump|admin|sh|import|check)?\b[^\n|;&]*?\s-p(?P<s>[^\s\"'-][^\s\"']*)", _not_port, 0),
    (("sshpass",), r"\bsshpass\s+-p\s*[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("redis-cli",), r"\bredis-cli\b[^\n|;&]*?\s-a\s+[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("--pass", "--token", "--api-key", "--secret", "--auth", "--body"),
     r"(?i)(?<![\w-])--(?:password|passwd|pass|token|api-key|apikey|secret|api-secret|client-secret|auth-token|"
     r"access-token)"
     r"(?:=(?P<q1>[\"']?)|\s+(?P<q2>[\"']?))(?P<s>[^\s\"']+)", _option_value, 0),
    (("secret set",), r"\bsecret\s+set\s+\S+\s+(?:--body|-b)(?:=|\s+)[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("config",),
     r"\bconfig(?:ure)?\s+(?:set\s+|--(?:global|local|system)\s+(?:--add\s+)?)(?P<n>[\w./:@-]+)[ \t]+[\"']?"
     r"(?P<s>[^\s\"']+)", _named_setting, 0),
    (("password",), r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?P<s>\S+)", _secret_group, 0),
    (("pass", "token", "secret", "key", "pwd", "auth", "cred"),
     r"(?i)<(?P<n>[\w.:-]{0,40}(?:pass|token|secret|key|pwd|auth|cred)[\w.:-]{0,40})(?:\s[^<>]*)?>\s*(?P<s>[^<\s]"
     r"[^<]{0,500}?)\s*</(?P=n)>", _named_setting, 0),
    # Provider token formats.
    (("akia", "asia", "aroa", "aida", "agpa", "anpa", "aipa", "abia", "acca", "a3t"),
     _AT + r"(?P<s>(?:AKIA|ASIA|AROA|AIDA|AGPA|ANPA|ANVA|AIPA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16})\b", _shaped, 0),
    (("fwogzxivyxdz", "fqogzxivyxdz", "iqojb3jpz2lu"),
     rf"(?P<s>(?:FwoGZXIvYXdz|FQoGZXIvYXdz|IQoJb3JpZ2lu){_B64}{{40,}}={{0,2}})", _shaped, 0),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _AT + r"(?P<s>gh[pousr]_[A-Za-z0-9]{30,})\b", _shaped, 0),
    (("github_pat_",), _AT + r"(?P<s>github_pat_[A-Za-z0-9_]{30,})", _shaped, 0),
    (("glpat-", "gldt-", "glptt-", "glrt-", "glsoat-", "glcbt-", "glft-", "glimt-", "gloas-"),
     _AT + rf"(?P<s>gl(?:pat|dt|ptt|rt|soat|cbt|ft|imt|oas)-{_TOK}{{20,}})", _shaped, 0),
    (("xox", "xapp-"), _AT + r"(?P<s>(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,})", _shaped, 0),
    (("sk_live_", "rk_live_", "sk_test_", "rk_test_", "whsec_"),
     _AT + r"(?P<s>(?:(?:sk|rk)_(?:live|test)|whsec)_[A-Za-z0-9]{16,})", _shaped, 0),
    (("sk-",), _AT + rf"(?P<s>sk-(?=[A-Za-z_-]*[0-9])(?:ant-|proj-|svcacct-|admin-)?{_TOK}{{20,}})", _shaped, 0),
    (("sg.",), _AT + rf"(?P<s>SG\.{_TOK}{{16,}}\.{_TOK}{{16,}})", _shaped, 0),
    (("npm_",), _AT + r"(?P<s>npm_[A-Za-z0-9]{36})\b", _shaped, 0),
    (("hf_",), _AT + r"(?P<s>hf_[A-Za-z0-9]{34})\b", _shaped, 0),
    (("pypi-",), _AT + rf"(?P<s>pypi-{_TOK}{{50,}})", _shaped, 0),
    (("hvs.", "hvb.", "hvr."), _AT + rf"(?P<s>hv[sbr]\.{_TOK}{{24,}})", _shaped, 0),
    (("age-secret-key-1",), _AT + r"(?P<s>AGE-SECRET-KEY-1[0-9A-Z]{50,})", _shaped, 0),
    (("1//0",), rf"(?<![\w/])(?P<s>1//0{_TOK}{{30,}})", _shaped, 0),
    # Telegram bot tokens: the bot's number, a colon, then AA and 33 more characters.
    ((":aa",), rf"(?<![\w:])(?P<s>\d{{6,12}}:AA{_TOK}{{30,}})", _shaped, 0),
    # Twilio API key and account SIDs
    (("SK",), r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))(?P<s>SK[0-9a-f]{32})(?![A-Za-z0-9])", _shaped, 0),
    (("AC",), r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))(?P<s>AC[0-9a-f]{32})(?![A-Za-z0-9])", _shaped, 0),
    (("aiza",), _AT + rf"(?P<s>AIza{_TOK}{{35}})", _shaped, 0),
    (("ya29.",), _AT + rf"(?P<s>ya29\.{_TOK}{{20,}})", _shaped, 0),
    (("gocspx-",), _AT + rf"(?P<s>GOCSPX-{_TOK}{{24,}})", _shaped, 0),
    (("dapi",), _AT + r"(?P<s>dapi[0-9a-f]{32})\b", _shaped, 0),
    (("dop_v1_", "doo_v1_", "dor_v1_"), _AT + r"(?P<s>do[por]_v1_[0-9a-f]{64})\b", _shaped, 0),
    (("shpat_", "shpss_", "shpca_", "shppa_"), _AT + r"(?P<s>shp(?:at|ss|ca|pa)_[0-9a-fA-F]{32})\b", _shaped, 0),
    (("eyj",), _AT + rf"(?P<s>eyJ{_TOK}{{8,}}\.(?:{_TOK}{{8,}}\.{_TOK}{{8,}}|eyJ{_TOK}{{8,}}\.?))", _shaped, 0),
] + CONTEXT_SPECS  # fmt: skip

XML_RULE = next(i for i, (_, source, _, _) in enumerate(RULE_SPECS) if source.startswith("(?i)<(?P<n>"))
RULES: list[tuple[re.Pattern[str], Replacement]] = [
    (re.compile(source, flags), replacement) for _, source, replacement, flags in RULE_SPECS
]

# Prefixes of the token formats above: a text that ends in one (a token cut off by the end of an output
# chunk) is redacted to its end when events are streamed (:class:`producers.redact.stream.SessionRedactor`).
TOKEN_PREFIXES = re.compile(
    r"(?:\b|(?<=\\[nrt]))(?:AKIA|ASIA|gh[pousr]_|github_pat_|glpat-|glrt-|xox[abposre]-|xapp-|sk_live_|rk_live_|"
    r"whsec_|sk-|SG\.|npm_|hf_|pypi-|hv[sbr]\.|AGE-SECRET-KEY-|1//0|AIza|ya29\.|GOCSPX-|dapi|do[por]_v1_|shp(?:at|ss)_|"
    r"eyJ)[A-Za-z0-9_./+=-]*\Z"
)
