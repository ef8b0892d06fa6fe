"""Verdicts from wherever benchmarks write them: harness reports, summaries, Harbor results.

Recognised shapes (by content, not by file name):

- **SWE-bench harness report, keyed**: ``{instance_id: {"resolved": bool, "tests_status": …}}``
  (``logs/run_evaluation/<run>/<model>/<instance>/report.json``, many runs' ``report.json``).
- **SWE-bench report, flat**: ``{"resolved": bool, "tests_status": …}`` without the instance key,
  as many harness wrappers write it; the instance is the report's ``instance_id``, else the
  directory it sits in, else the file name (``X.report.json``).
- **Summaries**: ``resolved_ids`` with ``unresolved_ids`` / ``completed_ids`` / ``empty_patch_ids``
  (SWE-bench's run report, sb-cli, Multi-SWE-bench's ``final_report.json``, OpenHands'
  ``report.json``, SWE-Gym's), SWE-smith's run report (``ids_resolved`` / ``ids_unresolved`` beside
  the counts), and the older ``results.json`` of lists (``resolved``, ``applied``, …).
  Multi-SWE-bench names instances ``org/repo:pr-N``; ``org__repo-N`` finds them too.
- **Harbor trial result** (``result.json``): ``verifier_result.rewards``; the task is
  ``task_name``.

An instance the harness could not evaluate (``error_ids``, ``test_errored``, SWE-smith's
``{"timed_out": true}`` report, a Harbor trial without a verifier result) gets no verdict: it is
listed in :attr:`VerdictFile.unevaluated`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from producers.importers._builder import ImportedSession, RunBuilder, Verdict
from producers.importers._source import ImportFormatError, SourceFile, read_json_file
from producers.sdk import Event
from schemas import typed

HARNESS = "harness_report"
HARBOR = "harbor_verifier"
SELF_REPORTED = "self_reported"
FLEET = "fleet_evaluator"
#: Every provenance a verdict can carry.
PROVENANCES = (FLEET, HARNESS, HARBOR, SELF_REPORTED)

# Lists of an old-style results.json whose instances were evaluated and did not pass, and those
# the harness could not evaluate.
_FAILED_LISTS = ("unresolved_ids", "empty_patch_ids", "no_generation", "generated", "applied", "no_apply", "with_logs")
_ERROR_LISTS = (
    "error_ids",
    "incomplete_ids",
    "test_errored",
    "test_timeout",
    "install_fail",
    "reset_failed",
    "no_logs",
)
# File names a verdict may have, next to a run or one directory up.
_VERDICT_NAMES = ("report.json", "results.json", "final_report.json", "result.json")


@dataclass
class VerdictFile:
    """What one verdict file says: verdicts by instance, and the instances it could not evaluate."""

    path: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    unevaluated: list[str] = field(default_factory=list)

    def get(self, instance_id: str) -> Verdict | None:
        """The verdict on ``instance_id`` (also under its Multi-SWE-bench spelling)."""
        return self.verdicts.get(instance_id) or self.verdicts.get(_alias(instance_id) or "")


def _alias(instance_id: str) -> str | None:
    """``org/repo:pr-12`` ↔ ``org__repo-12`` (Multi-SWE-bench's two spellings of an instance)."""
    if ":pr-" in instance_id and "/" in instance_id:
        repo, number = instance_id.split(":pr-", 1)
        return f"{repo.replace('/', '__', 1)}-{number}"
    return None


def instance_alias(instance_id: str) -> str | None:
    """The other spelling of a Multi-SWE-bench instance (``org/repo:pr-12`` → ``org__repo-12``), if it has one."""
    return _alias(instance_id)


def _tests(entry: dict[str, Any]) -> tuple[int, int]:
    """Tests passed and run by a report entry's ``tests_status`` (a bucket that is not a list counts none)."""
    passed = total = 0
    status = entry.get("tests_status")
    for buckets in status.values() if isinstance(status, dict) else ():
        if isinstance(buckets, dict):
            success, failure = buckets.get("success"), buckets.get("failure")
            ok = len(success) if isinstance(success, list) else 0
            passed += ok
            total += ok + (len(failure) if isinstance(failure, list) else 0)
    return total, passed


def _finite(value: Any) -> float | None:
    """A reward a report gives as a number (not a bool), when it is a finite float; else None."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def _report_verdict(instance_id: str, entry: dict[str, Any], source: str, evaluator: str = "swe-bench") -> Verdict:
    total, passed = _tests(entry)
    resolved = bool(entry.get("resolved"))
    details = json.dumps({k: v for k, v in entry.items() if k != "tests_status"}, sort_keys=True, default=str)
    return Verdict(instance_id, resolved, 1.0 if resolved else 0.0, HARNESS, evaluator, total, passed, details, source)


def _is_report_entry(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("resolved"), bool)


def _is_timeout_report(value: Any) -> bool:
    """SWE-smith's per-instance report when the evaluation timed out: ``{"timed_out": true, "timeout": N}``."""
    return isinstance(value, dict) and value.get("timed_out") is True and "resolved" not in value


def _flat_instance(path: Path, data: dict[str, Any]) -> str:
    """The instance a flat report is about: its own field, else its directory, else its file name."""
    own = data.get("instance_id")
    if isinstance(own, str) and own:
        return own
    name = path.name
    if name.endswith(".report.json"):
        return name.removesuffix(".report.json")
    return path.parent.name


def _id_list(data: dict[str, Any], *names: str) -> list[Any]:
    """The first of ``names`` that holds a list in ``data`` (an id list), else an empty list."""
    return next((data[name] for name in names if isinstance(data.get(name), list)), [])


def _summary_verdicts(data: dict[str, Any], result: VerdictFile) -> None:
    resolved = [str(i) for i in _id_list(data, "resolved_ids", "ids_resolved", "resolved") if i is not None]
    errors = {str(i) for name in _ERROR_LISTS for i in data.get(name) or [] if isinstance(data.get(name), list)}
    failed = {str(i) for name in _FAILED_LISTS for i in data.get(name) or [] if isinstance(data.get(name), list)}
    failed |= {str(i) for i in _id_list(data, "completed_ids")}
    failed |= {str(i) for i in _id_list(data, "ids_unresolved") if i is not None}
    evaluator = "multi-swe-bench" if any(":pr-" in i for i in [*resolved, *failed]) else "swe-bench"
    for instance in resolved:
        details = json.dumps({"listed_in": "resolved", "report": result.path}, sort_keys=True)
        result.verdicts[instance] = Verdict(
            instance, True, 1.0, HARNESS, evaluator, details=details, source=result.path
        )
    for instance in sorted(failed - set(resolved) - errors):
        details = json.dumps({"listed_in": "unresolved", "report": result.path}, sort_keys=True)
        result.verdicts[instance] = Verdict(
            instance, False, 0.0, HARNESS, evaluator, details=details, source=result.path
        )
    result.unevaluated += sorted(errors - set(resolved))
    for verdict in list(result.verdicts.values()):
        alias = _alias(verdict.instance_id)
        if alias:
            result.verdicts.setdefault(alias, verdict)


def _harbor_verdict(data: dict[str, Any], result: VerdictFile) -> None:
    task = str(data.get("task_name") or data.get("trial_name") or "")
    verifier = data.get("verifier_result")
    rewards = verifier.get("rewards") if isinstance(verifier, dict) else None
    rewards = rewards if isinstance(rewards, dict) else {}
    values = [v for v in map(_finite, rewards.values()) if v is not None]
    if not task or not values:
        if task:
            result.unevaluated.append(task)
        return
    named = _finite(rewards.get("reward"))
    reward = named if named is not None else sum(values) / len(values)
    if not math.isfinite(reward):  # finite rewards whose sum is not
        result.unevaluated.append(task)
        return
    details = json.dumps(
        {
            "rewards": rewards,
            "trial_name": data.get("trial_name"),
            "exception": info.get("exception_type") if isinstance(info := data.get("exception_info"), dict) else None,
        },
        sort_keys=True,
        default=str,
    )
    result.verdicts[task] = Verdict(task, reward >= 1.0, reward, HARBOR, "harbor", details=details, source=result.path)


def is_harbor_result(data: Any) -> bool:
    """Whether parsed JSON is a Harbor trial's ``result.json``."""
    return isinstance(data, dict) and "verifier_result" in data and ("trial_name" in data or "task_name" in data)


def parse_verdicts(path: Path, data: Any) -> VerdictFile | None:
    """The verdicts ``data`` (read from ``path``) holds, or None when it is no verdict file."""
    result = VerdictFile(str(path))
    if not isinstance(data, dict) or not data:
        return None
    if is_harbor_result(data):
        _harbor_verdict(data, result)
    elif any(isinstance(data.get(name), list) for name in ("resolved_ids", "ids_resolved", "resolved")):
        _summary_verdicts(data, result)
    elif _is_timeout_report(data):
        result.unevaluated.append(_flat_instance(path, data))
    elif _is_report_entry(data) and (
        "tests_status" in data
        or "patch_successfully_applied" in data
        or "patch_is_None" in data
        or "instance_id" in data
    ):
        instance = _flat_instance(path, data)
        result.verdicts[instance] = _report_verdict(instance, data, str(path))
    elif all(_is_report_entry(v) for v in data.values()):
        for instance, entry in data.items():
            result.verdicts[str(instance)] = _report_verdict(str(instance), entry, str(path))
    else:
        return None
    return result


@lru_cache(maxsize=256)
def _read_cached(path: str, mtime_ns: int, size: int) -> VerdictFile | None:
    """One verdict file, parsed once per version (a directory of runs shares one summary)."""
    return parse_verdicts(Path(path), read_json_file(Path(path)))


def read_verdict_file(path: Path) -> VerdictFile | None:
    """The verdicts in ``path``, or None when it holds none.

    Raises:
        ImportFormatError: the file exists but is not valid JSON.
    """
    try:
        stat = path.stat()
    except OSError:
        return None
    return _read_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def verdict_files(path: Path) -> Iterator[Path]:
    """Every candidate verdict file in ``path`` (a file, or a directory searched recursively)."""
    if path.is_file():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".json") and (
                name in _VERDICT_NAMES or "report" in name or "result" in name or "eval" in name
            ):
                yield Path(root) / name


def read_verdicts(path: Path | str) -> tuple[list[VerdictFile], list[str]]:
    """Every verdict under ``path`` and one line per candidate file that could not be read.

    Raises:
        ImportFormatError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise ImportFormatError(path, "no such file or directory")
    found, errors = [], []
    for candidate in verdict_files(path):
        try:
            verdicts = read_verdict_file(candidate)
        except ImportFormatError as exc:
            errors.append(str(exc))
            continue
        if verdicts is not None and (verdicts.verdicts or verdicts.unevaluated):
            found.append(verdicts)
    if path.is_file() and not found and not errors:
        errors.append(f"{path}: no verdicts in it (not a SWE-bench report or summary, nor a Harbor result.json)")
    return found, errors


#: How many directories above a run its harness reports are looked for (a run report sits at the
#: top of the run's tree: ``<run>/<instance>/<instance>.traj`` under ``<run>/report.json``).
BESIDE_LEVELS = 3


def _beside(run: Path, names: Iterable[str]) -> Iterator[Path]:
    stem = run.name.removesuffix(".json").removesuffix(".jsonl").removesuffix(".traj")
    for directory in [run.parent, *run.parent.parents][:BESIDE_LEVELS]:
        for name in (f"{stem}.report.json", *names):
            candidate = directory / name
            if candidate != run and candidate.is_file():
                yield candidate


def verdict_beside(run: Path, instance_id: str) -> Verdict | None:
    """The verdict on ``instance_id`` in a report next to the run (or one directory up), if any.

    The most specific wins: ``<run>.report.json``, then ``report.json``, ``results.json``,
    ``final_report.json`` in the run's directory, then in each directory above it (up to
    ``BESIDE_LEVELS``); only a verdict on exactly ``instance_id`` counts.

    Raises:
        ImportFormatError: a report is there but is not valid JSON.
    """
    for candidate in _beside(run, _VERDICT_NAMES):
        verdicts = read_verdict_file(candidate)
        verdict = verdicts.get(instance_id) if verdicts is not None else None
        if verdict is not None:
            return verdict
    return None


#: Namespace of the ids of verdict events attached to a session after its import.
VERDICT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://trajlake/verdicts")
#: ``host_id`` and ``extra['source_kind']`` of verdicts attached later (``trajlake import --verdicts``).
LATE_HOST = "verdicts"


def verdict_event(envelope: dict[str, Any], verdict: Verdict, *, seq: int, ts: int, host_id: str = LATE_HOST) -> Event:
    """An ``evaluation`` event carrying ``verdict`` for the session ``envelope`` describes.

    Its id derives from the session and the verdict's content, so attaching the same verdict
    again re-sends the same event (kept once), and a changed report is a new evaluation.

    Args:
        envelope: the session's envelope fields (``session_id``, ``task_id``, ``task_type``, …).
        verdict: what to attach.
        seq: the event's place in the session (after its last event).
        ts: its time (micros).
        host_id: who sends it: ``verdicts`` for a late verdict (an identity of its own, see
            ``pipelines.intake.ownership``), the session's own host when it joins the import.
    """
    key = json.dumps([verdict.instance_id, verdict.passed, verdict.reward, verdict.provenance, verdict.details])
    session_id = str(envelope["session_id"])
    source_sha = hashlib.sha256(verdict.source.encode()).hexdigest() if verdict.source else ""
    extra = {"source_kind": LATE_HOST, "source_sha256": source_sha, "verdict_source": verdict.source[:1000]}
    if host_id != LATE_HOST:
        extra = dict(envelope.get("extra") or {})
    payload: typed.Evaluation = {
        "passed": verdict.passed,
        "tests_total": verdict.tests_total,
        "tests_passed": verdict.tests_passed,
        "reward": verdict.reward,
        "fresh_sandbox": False,
        "evaluator": verdict.evaluator,
        "duration_ms": 0.0,
        "details": verdict.details,
        "provenance": verdict.provenance,
    }
    return {
        "event_id": uuid.uuid5(VERDICT_NAMESPACE, f"{session_id}/{key}").hex,
        "session_id": session_id,
        "seq": seq,
        "ts": ts,
        "event_type": "evaluation",
        "source": "evaluator",
        "sandbox_id": str(envelope.get("sandbox_id") or session_id),
        "task_id": str(envelope.get("task_id") or verdict.instance_id),
        "task_type": str(envelope.get("task_type") or "imported"),
        "host_id": host_id,
        "image_name": str(envelope.get("image_name") or "unknown"),
        "image_version": str(envelope.get("image_version") or "0"),
        "agent_name": envelope.get("agent_name"),
        "agent_version": envelope.get("agent_version"),
        "agent_model": envelope.get("agent_model"),
        "policy_version": envelope.get("policy_version"),
        "agent_message_id": None,
        "parent_event_id": None,
        "extra": extra,
        "payload": dict(payload),
    }


def with_verdicts(session: ImportedSession, files: Iterable[VerdictFile], *, beside: bool = False) -> Verdict | None:
    """Append the verdict the files hold on ``session``'s task (unless it is there already); the verdict or None.

    The event joins the import (the session's own identity), after its last event. Whatever verdict the
    run's own files carry -- a claim (``self_reported``) or a harness result written beside the run -- the
    report given with the import joins it: which one counts is assembly's verdict precedence, not decided
    here (at an equal rank the later, the report's). Skipping it when the file already had a 'harness'
    verdict let the run's own file overrule the operator's report on that exact instance, silently.
    ``beside``: the reports were found in the imported tree itself (part of what is imported, not given by
    the operator): they judge only a session that brought no harness or fleet verdict of its own.
    """
    if not session.events:
        return None
    judged = (HARNESS, HARBOR, FLEET)
    if beside and any(
        e["event_type"] == "evaluation" and (e["payload"].get("provenance") or FLEET) in judged for e in session.events
    ):
        return None
    verdict = next((v for f in files if (v := f.get(session.task_id)) is not None), None)
    if verdict is None:
        return None
    last = session.events[-1]
    first = session.events[0]
    event = verdict_event(first, verdict, seq=last["seq"] + 1, ts=last["ts"] + 1000, host_id=first["host_id"])
    if any(e["event_id"] == event["event_id"] for e in session.events):
        return None  # this report's verdict joined already
    session.events.append(event)
    return verdict


def attach_verdict_beside(builder: RunBuilder, source: SourceFile, instance_id: str) -> None:
    """Add the verdict a report next to the run gives ``instance_id`` (after ``session_end``).

    A report that cannot be read does not cost the run: it is noted among the set-aside fields.
    """
    try:
        verdict = verdict_beside(source.path, instance_id)
    except ImportFormatError as exc:
        builder.issues.add("verdict", exc.reason)
        return
    if verdict is not None:
        builder.verdict(verdict)


__all__ = [
    "FLEET",
    "HARBOR",
    "HARNESS",
    "PROVENANCES",
    "SELF_REPORTED",
    "Verdict",
    "VerdictFile",
    "LATE_HOST",
    "attach_verdict_beside",
    "instance_alias",
    "verdict_event",
    "with_verdicts",
    "is_harbor_result",
    "parse_verdicts",
    "read_verdict_file",
    "read_verdicts",
    "verdict_beside",
    "verdict_files",
]
