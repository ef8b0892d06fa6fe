"""Import Harbor trial and job directories: the ATIF trajectory of each trial and its verifier's verdict.

A **trial** directory holds ``result.json`` (Harbor's trial result: ``task_name``,
``agent_info``, ``exception_info``, ``verifier_result.rewards``) and the agent's logs under
``agent/``; an agent that writes ATIF leaves ``agent/trajectory.json`` (a multi-step trial:
``steps/<name>/agent/trajectory.json``). A **job** directory holds one trial directory per run
(and its own ``result.json`` and ``config.json``).

Each trajectory is imported by :mod:`producers.importers.atif` with what the trial result says:
the task (``task_name``), the agent and model, the exception that ended the trial (an agent
timeout is a limit, an API failure infrastructure), and the verdict: the reward Harbor's
verifier wrote (``verifier_result.rewards``, provenance ``harbor_verifier``; passed when the reward
is 1). A trial without an ATIF trajectory is reported, never imported as an empty session.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from producers.importers import atif
from producers.importers._builder import Verdict
from producers.importers._common import ImportedSession, ImportFormatError, SourceFile, object_of, text_of
from producers.importers._source import parse_record, read_bytes, read_json_file
from producers.importers.verdicts import HARBOR, is_harbor_result, parse_verdicts

FRAMEWORK = "harbor"
#: Where an ATIF-writing agent leaves its trajectory in a trial directory.
TRAJECTORY_NAMES = ("agent/trajectory.json", "agent/trajectory.atif.json")


def _result(path: Path) -> dict[str, Any] | None:
    try:
        data = read_json_file(path / "result.json")
    except ImportFormatError:
        return None
    return data if is_harbor_result(data) else None


def is_trial_dir(path: Path) -> bool:
    """Whether ``path`` is a Harbor trial directory (a trial ``result.json``, or agent logs with an ATIF trajectory)."""
    if not path.is_dir():
        return False
    if _result(path) is not None:
        return True
    return (path / "agent").is_dir() and any((path / name).is_file() for name in TRAJECTORY_NAMES)


def is_job_dir(path: Path) -> bool:
    """Whether ``path`` is a Harbor job directory (it holds trial directories)."""
    return path.is_dir() and not is_trial_dir(path) and any(is_trial_dir(child) for child in trial_dirs(path))


def trial_dirs(job: Path) -> list[Path]:
    """The trial directories of a job, by name."""
    return sorted(child for child in job.iterdir() if child.is_dir() and is_trial_dir(child))


def trajectories(trial: Path) -> list[Path]:
    """The ATIF trajectories of a trial: ``agent/trajectory.json``, or one per step of a multi-step trial."""
    found = [trial / name for name in TRAJECTORY_NAMES if (trial / name).is_file()]
    steps = trial / "steps"
    if steps.is_dir():
        for step in sorted(p for p in steps.iterdir() if p.is_dir()):
            found += [step / name for name in TRAJECTORY_NAMES if (step / name).is_file()]
    return found


def trial_of(path: Path) -> Path | None:
    """The trial directory whose trajectory ``path`` is (``agent/trajectory.json`` or a step's), if it is one.

    A trajectory imported by itself still gets its trial's task, agent and verdict (``../result.json``).
    """
    parents = path.parents
    for depth in (2, 4):  # <trial>/agent/trajectory.json, <trial>/steps/<step>/agent/trajectory.json
        if len(parents) < depth:
            continue
        trial = parents[depth - 1]
        if path.resolve() in {p.resolve() for p in trajectories(trial)} and _result(trial) is not None:
            return trial
    return None


#: What Harbor's verifier writes in ``<trial>/verifier/`` (a reward as text, or rewards as JSON).
_REWARD_FILES = ("reward.txt", "reward.json")


def verifier_output(trial: Path, task: str) -> Verdict | None:
    """The verdict the verifier wrote in ``verifier/`` when the trial's result carries none (it stopped before)."""
    for name in _REWARD_FILES:
        path = trial / "verifier" / name
        if not path.is_file():
            continue
        try:
            text = read_bytes(path).decode("utf-8", "replace").strip()
            rewards: Any = read_json_file(path) if name.endswith(".json") else {"reward": text}
        except ImportFormatError:
            continue
        values = rewards if isinstance(rewards, dict) else {"reward": rewards}
        try:
            reward = float(values["reward"]) if "reward" in values else min(float(v) for v in values.values())
        except (TypeError, ValueError, KeyError):
            continue
        if reward != reward:  # NaN: no verdict
            continue
        details = json.dumps({"verifier_output": str(path.name), "rewards": values}, sort_keys=True, default=str)
        return Verdict(task, reward >= 1.0, reward, HARBOR, "harbor", details=details, source=str(path))
    return None


def _trial_context(trial: Path, result: dict[str, Any] | None) -> atif.Trial:
    if result is None:
        return atif.Trial()
    info = object_of(result.get("agent_info"))
    model = object_of(info.get("model_info"))
    exception = object_of(result.get("exception_info"))
    verdicts = parse_verdicts(trial / "result.json", result)
    task = str(result.get("task_name") or "") or None
    verdict = verdicts.get(task) if verdicts is not None and task else None
    if verdict is None and task and not object_of(result.get("verifier_result")).get("rewards"):
        verdict = verifier_output(trial, task)
    text = None
    if exception:
        text = f"{text_of(exception.get('exception_type'))}: {text_of(exception.get('exception_message'))}"
    provider = f"{model['provider']}/" if model.get("provider") else ""
    return atif.Trial(
        task_id=task,
        agent_name=str(info["name"]) if info.get("name") else None,
        agent_version=str(info["version"]) if info.get("version") else None,
        agent_model=f"{provider}{model['name']}" if model.get("name") else None,
        exception=text,
        verdict=verdict,
    )


def convert_trial(trial: Path, only: Path | None = None) -> list[ImportedSession]:
    """The sessions of one Harbor trial (one per ATIF trajectory; the verdict joins the last).

    Args:
        trial: the trial directory.
        only: one of its trajectories, imported by itself (with the trial's result when it is the last).

    Raises:
        ImportFormatError: no ATIF trajectory in the trial, or one that is not valid ATIF.
    """
    found = trajectories(trial)
    if not found:
        raise ImportFormatError(trial, "Harbor trial without an ATIF trajectory (agent/trajectory.json)")
    context = _trial_context(trial, _result(trial))
    sessions: list[ImportedSession] = []
    for position, path in enumerate(found):
        if only is not None and path.resolve() != only.resolve():
            continue
        raw = read_bytes(path)
        data, repaired = parse_record(path, raw)
        if not atif.looks_like(data):
            raise ImportFormatError(path, f"not an ATIF trajectory ({atif.why_not(data)})")
        last = position == len(found) - 1
        own = (
            context
            if last
            else atif.Trial(context.task_id, context.agent_name, context.agent_version, context.agent_model)
        )
        source = SourceFile(path, hashlib.sha256(raw).hexdigest(), data, trial.name, repaired)
        sessions += atif.convert(source, own)
    return sessions
