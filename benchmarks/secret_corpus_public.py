"""Labelled corpora the redaction rules were not written from, fetched from package registries when used.

- **gitleaks** (the Go module ``github.com/zricethezav/gitleaks/v8``, pinned): every rule of its default
  configuration carries true-positive and false-positive examples in its Go source, many generated
  (random secrets in ~25 assignment styles: INI, JSON, YAML, XML, Go, Java, PHP, Makefile …). A small
  program, written into the cache next to the module, records each example instead of validating it,
  with the secret the rule's own detector finds in it, and whether any rule of the full default
  configuration fires on each false-positive example. Positives: examples with a secret found.
  Negatives: false-positive examples no gitleaks rule fires on. Needs ``go`` and the Go module proxy.
- **ordinary text**: the source and documentation of a pinned PyPI sdist (Django: settings, auth,
  sessions, signing — ``password``, ``token``, ``key`` and ``secret`` in ordinary use), and the shell
  scripts of a pinned Debian package that handles database passwords (``dbconfig-common``). Units are
  windows of lines holding a trigger word; none holds a real secret, so any change is a false positive
  (documentation's example credentials included, which is strict).

Everything is cached under ``~/.cache/trajlake/secret-corpora``; nothing is vendored. Each corpus is split
deterministically into a *tune* half and a *held-out* half by a hash of its family (gitleaks: the rule
id's first word, so ``github-pat`` and ``github-app-token`` fall together; text: the file path), so the
held-out half holds secret formats and files the rules were never adjusted on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trajlake" / "secret-corpora"
GITLEAKS_MODULE = "github.com/zricethezav/gitleaks/v8"
GITLEAKS_VERSION = "v8.30.1"
ORDINARY_SDIST = ("django", "5.1.4")
ORDINARY_DEB = ("dbconfig-common", "2.0.24")
# Ordinary-text units: this many lines around each line holding one of these words.
_WINDOW = 12
_WORDS = re.compile(r"(?i)pass|secret|token|key|auth|cred|cookie|pwd")
_TEXT_SUFFIXES = (".py", ".txt", ".rst", ".sh", ".cfg", ".ini", ".toml", ".yml", ".yaml", ".json", ".html", "")


class CorpusUnavailable(Exception):
    """A corpus cannot be fetched or built here (no ``go``, registry unreachable); the reason says which."""


@dataclass(frozen=True)
class LabelledText:
    """One example: a text, the secrets in it (none for a negative), its family and its half."""

    source: str
    family: str
    text: str
    secrets: tuple[str, ...]
    held_out: bool

    @property
    def positive(self) -> bool:
        """Whether the text holds a secret."""
        return bool(self.secrets)


def held_out(family: str) -> bool:
    """The half a family belongs to: fixed by a hash, so it never depends on what the rules do."""
    return hashlib.sha256(family.encode()).digest()[0] % 2 == 1


def _run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 900) -> str:
    try:
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CorpusUnavailable(f"{command[0]}: {exc}") from exc
    if done.returncode != 0:
        raise CorpusUnavailable(f"{' '.join(command[:3])} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


# -- gitleaks --------------------------------------------------------------------------------------------------

# Replaces the module's ``utils/validate.go``: the rules call Validate with their examples; this records them.
_RECORDER = """package utils

import (
\t"strings"

\t"github.com/zricethezav/gitleaks/v8/cmd/generate/config/base"
\t"github.com/zricethezav/gitleaks/v8/config"
\t"github.com/zricethezav/gitleaks/v8/detect"
)

type Sample struct {
\tRule     string   `json:"rule"`
\tPositive bool     `json:"positive"`
\tText     string   `json:"text"`
\tSecrets  []string `json:"secrets"`
}

var Samples []Sample

func record(r *config.Rule, texts []string, positive bool) {
\td := detector(r)
\tfor _, text := range texts {
\t\tfound := []string{}
\t\tfor _, f := range d.DetectString(text) {
\t\t\tfound = append(found, f.Secret)
\t\t}
\t\tSamples = append(Samples, Sample{Rule: r.RuleID, Positive: positive, Text: text, Secrets: found})
\t}
}

func Validate(rule config.Rule, tps []string, fps []string) *config.Rule {
\trecord(&rule, tps, true)
\trecord(&rule, fps, false)
\treturn &rule
}

func ValidateWithPaths(rule config.Rule, tps map[string]string, fps map[string]string) *config.Rule {
\tvalues := func(m map[string]string) []string {
\t\tout := []string{}
\t\tfor _, v := range m {
\t\t\tout = append(out, v)
\t\t}
\t\treturn out
\t}
\trecord(&rule, values(tps), true)
\trecord(&rule, values(fps), false)
\treturn &rule
}

func detector(r *config.Rule) *detect.Detector {
\tkeywords := map[string]struct{}{}
\tlowered := []string{}
\tfor _, k := range r.Keywords {
\t\tk = strings.ToLower(k)
\t\tif _, seen := keywords[k]; !seen {
\t\t\tkeywords[k] = struct{}{}
\t\t\tlowered = append(lowered, k)
\t\t}
\t}
\tr.Keywords = lowered
\tcfg := base.CreateGlobalConfig()
\tcfg.Rules = map[string]config.Rule{r.RuleID: *r}
\tcfg.Keywords = keywords
\treturn detect.NewDetector(cfg)
}
"""

_HARVEST = """package main

import (
\t"encoding/json"
\t"os"

\t"github.com/zricethezav/gitleaks/v8/cmd/generate/config/rules"
\t"github.com/zricethezav/gitleaks/v8/cmd/generate/config/utils"
\t"github.com/zricethezav/gitleaks/v8/detect"
)

func main() {
%s
\tfull, err := detect.NewDetectorDefaultConfig()
\tif err != nil {
\t\tpanic(err)
\t}
\ttype row struct {
\t\tutils.Sample
\t\tAny int `json:"any"`
\t}
\tout := json.NewEncoder(os.Stdout)
\tfor _, s := range utils.Samples {
\t\tif err := out.Encode(row{s, len(full.DetectString(s.Text))}); err != nil {
\t\t\tpanic(err)
\t\t}
\t}
}
"""


def _gitleaks_rows(cache: Path) -> list[dict[str, object]]:
    rows_path = cache / f"gitleaks-{GITLEAKS_VERSION}.jsonl"
    if not rows_path.is_file():
        go = shutil.which("go")
        if go is None:
            raise CorpusUnavailable("the gitleaks corpus needs the Go toolchain (go) to build its examples")
        env = {**os.environ, "GOMODCACHE": str(cache / "gomod"), "GOFLAGS": "-modcacherw -mod=mod"}
        info = json.loads(_run([go, "mod", "download", "-json", f"{GITLEAKS_MODULE}@{GITLEAKS_VERSION}"], env=env))
        if "Dir" not in info:
            raise CorpusUnavailable(f"go mod download: {info.get('Error', 'no module directory')}")
        with tempfile.TemporaryDirectory(dir=cache) as work:
            source = Path(work) / "gitleaks"
            shutil.copytree(info["Dir"], source)
            for path in source.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            (source / "cmd/generate/config/utils/validate.go").write_text(_RECORDER)
            calls = re.findall(r"\brules\.\w+\(\)", (source / "cmd/generate/config/main.go").read_text())
            (source / "cmd/harvest").mkdir()
            (source / "cmd/harvest/main.go").write_text(_HARVEST % "\n".join(f"\t_ = {c}" for c in calls))
            rows = _run([go, "run", "./cmd/harvest"], env=env, cwd=source)
        rows_path.write_text(rows)
    return [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]


def gitleaks_examples(cache: Path = CACHE_DIR) -> list[LabelledText]:
    """gitleaks' rule examples: positives with the secret its rule finds, negatives no rule fires on.

    Raises:
        CorpusUnavailable: no ``go``, or the module proxy is unreachable (and nothing is cached).
    """
    cache.mkdir(parents=True, exist_ok=True)
    examples = []
    for row in _gitleaks_rows(cache):
        rule, text = str(row["rule"]), str(row["text"])
        family = rule.split("-")[0]
        secrets = tuple(sorted({s for s in row["secrets"] if isinstance(s, str) and len(s) >= 6}))  # type: ignore[attr-defined]
        if row["positive"] and secrets:
            examples.append(LabelledText("gitleaks", family, text, secrets, held_out(family)))
        elif not row["positive"] and not row["any"] and text.strip():
            examples.append(LabelledText("gitleaks", family, text, (), held_out(family)))
    return examples


# -- ordinary text ---------------------------------------------------------------------------------------------


def _sdist(cache: Path) -> Path:
    name, version = ORDINARY_SDIST
    found = sorted(cache.glob(f"[{name[0]}{name[0].upper()}]{name[1:]}-{version}.tar.gz"))
    if not found:
        pip = [shutil.which("pip") or "pip"]
        _run([*pip, "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(cache), f"{name}=={version}"])
        found = sorted(cache.glob(f"[{name[0]}{name[0].upper()}]{name[1:]}-{version}.tar.gz"))
    if not found:
        raise CorpusUnavailable(f"pip download {name}=={version} left no sdist in {cache}")
    return found[0]


def _deb(cache: Path) -> Path:
    name, version = ORDINARY_DEB
    found = sorted(cache.glob(f"{name}_{version}_*.deb"))
    if not found:
        _run(["apt-get", "download", f"{name}={version}"], cwd=cache, timeout=120)
        found = sorted(cache.glob(f"{name}_{version}_*.deb"))
    if not found:
        raise CorpusUnavailable(f"apt-get download {name}={version} left no package in {cache}")
    return found[0]


def _windows(source: str, path: str, text: str) -> Iterator[LabelledText]:
    lines = text.splitlines(keepends=True)
    covered = -1
    for number, line in enumerate(lines):
        if number <= covered or not _WORDS.search(line):
            continue
        window = "".join(lines[number : number + _WINDOW])
        covered = number + _WINDOW - 1
        yield LabelledText(source, path, window, (), held_out(path))


def ordinary_texts(cache: Path = CACHE_DIR) -> list[LabelledText]:
    """Windows of ordinary code, docs and shell scripts that mention passwords, tokens or keys.

    Raises:
        CorpusUnavailable: neither the sdist nor the Debian package can be had (nothing cached either).
    """
    cache.mkdir(parents=True, exist_ok=True)
    units: list[LabelledText] = []
    reasons = []
    try:
        with tarfile.open(_sdist(cache)) as archive:
            for member in archive.getmembers():
                name = member.name.split("/", 1)[-1]
                if not member.isfile() or not name.endswith(_TEXT_SUFFIXES) or "/locale/" in name:
                    continue
                data = archive.extractfile(member)
                if data is not None:
                    units += _windows(ORDINARY_SDIST[0], name, data.read().decode("utf-8", "replace"))
    except CorpusUnavailable as exc:
        reasons.append(str(exc))
    try:
        with tempfile.TemporaryDirectory() as work:
            _run(["dpkg-deb", "-x", str(_deb(cache)), work], timeout=60)
            for path in sorted(Path(work).rglob("*")):
                if path.is_file() and not path.is_symlink():
                    text = path.read_bytes().decode("utf-8", "replace")
                    name = str(path.relative_to(work))
                    units += _windows(ORDINARY_DEB[0], name, text)
    except CorpusUnavailable as exc:
        reasons.append(str(exc))
    if not units:
        raise CorpusUnavailable("; ".join(reasons))
    return units
