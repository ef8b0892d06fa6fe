"""``trajlake bench import``: importing a recorded run is linear in its size, in time and in memory.

Recorded runs of 1.6, 3.2, 6.4 and 12.8 MB (a mini-swe-agent 2.x run whose turns repeat with fresh
ids and texts, so every turn is new content) are imported one at a time, each in a fresh process so
its peak RSS is its own. The table gives seconds and peak RSS per MB; the ratio of the largest run's
time per MB to the smallest's is the figure (1.0 is linear; a quadratic import doubles it at each
doubling of the size, 8.0 across the range).

Then two bounds of streamed import: a Harbor job of ``JOB_TRIALS`` trials (each trial a real-shaped
ATIF run with its verifier's result) imported as ``trajlake import`` does — each session encoded and
let go before the next trial is read — gives its peak RSS above the baseline per trial at two job
sizes (bounded memory: the larger job's peak is about the smaller's); and a run whose one tool
output is a single line of ``LINE_MB`` MB gives its peak RSS above the baseline per MB of that line
(also with redaction off, and when one more model call follows, whose request sends the line again).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

#: Run sizes, in MB (each twice the last).
SIZES_MB = (1.6, 3.2, 6.4, 12.8)
#: Trials of the two Harbor jobs (the second four times the first).
JOB_TRIALS = (150, 600)
#: Size of the one-line tool output of the large-line run, in MB.
LINE_MB = 24.0
#: The Harbor trial every job trial is a copy of (with its own task name, so each is new content).
_TRIAL = Path(__file__).resolve().parents[1] / "tests" / "producers" / "importers" / "fixtures" / "harbor_job"


def recorded_run(target_bytes: int) -> dict[str, Any]:
    """A mini-swe-agent 2.x run of about ``target_bytes`` bytes: a system and a task message, then turns."""
    system = {"role": "system", "content": "You are a helpful assistant that can interact with a computer."}
    task = {"role": "user", "content": "Fix: parse_units('MB') is case-sensitive.", "extra": {"timestamp": 1.7e9}}
    messages: list[dict[str, Any]] = [system, task]
    size, turn = 2000, 0
    while size < target_bytes:
        command = f"sed -n '{turn},{turn + 40}p' widgets/module_{turn % 97}.py"
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        assistant = {
            "role": "assistant",
            "content": f"Step {turn}: read the next part of module {turn % 97}. " + "I am reasoning about it. " * 12,
            "tool_calls": [call],
            "extra": {
                "actions": [{"command": command, "tool_call_id": call["id"]}],
                "response": {
                    "id": f"resp-{turn}",
                    "usage": {"prompt_tokens": 2000 + 30 * turn, "completion_tokens": 80},
                },
                "cost": 0.0004,
                "timestamp": 1.7e9 + 10 * turn,
            },
        }
        output = "".join(f"{turn}:{n}\tvalue_{n} = compute({turn}, {n})  # line of module\n" for n in range(40))
        tool = {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": f"<returncode>0</returncode>\n<output>\n{output}</output>",
            "extra": {"raw_output": output, "returncode": 0, "timestamp": 1.7e9 + 10 * turn + 1},
        }
        messages += [assistant, copy.deepcopy(tool)]
        size += len(json.dumps(assistant)) + len(json.dumps(tool))
        turn += 1
    return {
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": "acme__widgets-900",
        "info": {
            "exit_status": "Submitted",
            "submission": "",
            "model_stats": {"instance_cost": 0.1, "api_calls": turn},
        },
        "messages": messages,
    }


def _import_in_child(path: str, queue: Any) -> None:
    from producers.importers import import_file

    started = time.perf_counter()
    (session,) = import_file(path).sessions
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put((seconds, rss, session.steps, len(session.events)))


def measure(path: Path) -> tuple[float, int, int, int]:
    """(seconds, peak RSS bytes, steps, events) of importing ``path`` in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_import_in_child, args=(str(path), queue))
    child.start()
    result = queue.get(timeout=3600)
    child.join()
    return result


def _baseline_rss() -> int:
    """Peak RSS of a fresh process that only loads the importers (what every measurement includes)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_load_only, args=(queue,))
    child.start()
    rss = int(queue.get(timeout=600))
    child.join()
    return rss


def _stream_in_child(path: str, queue: Any, redact: bool = True) -> None:
    from producers.importers import import_paths
    from producers.importers._builder import REDACT
    from schemas.registry import encode_event

    REDACT.set(redact)

    sessions = 0

    def send(session: Any) -> None:  # as the CLI's sender: every event encoded, then the session let go
        nonlocal sessions
        encoded = [encode_event(event) for event in session.events]
        sessions += 1
        del encoded

    started = time.perf_counter()
    report = import_paths([path], send=send)
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put((seconds, rss, sessions, len(report.quarantined)))


def _measure_stream(path: Path, redact: bool = True) -> tuple[float, int, int, int]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_stream_in_child, args=(str(path), queue, redact))
    child.start()
    result = queue.get(timeout=3600)
    child.join()
    return result


def harbor_job(directory: Path, trials: int) -> Path:
    """A Harbor job of ``trials`` trials, each a copy of the fixture trial under its own task name."""
    job = directory / f"job-{trials}"
    job.mkdir()
    template = _TRIAL / "hello-world__Xy7aQ"
    result = json.loads((template / "result.json").read_text())
    trajectory = json.loads((template / "agent" / "trajectory.json").read_text())
    for n in range(trials):
        trial = job / f"task-{n}__t{n}"
        (trial / "agent").mkdir(parents=True)
        (trial / "result.json").write_text(json.dumps({**result, "task_name": f"task-{n}", "trial_name": trial.name}))
        (trial / "agent" / "trajectory.json").write_text(json.dumps({**trajectory, "session_id": f"s-{n}"}))
    return job


def large_line_run(megabytes: float, answered: bool = False) -> dict[str, Any]:
    """A mini-swe-agent 2.x run of one turn whose tool output is a single line of ``megabytes`` MB.

    With ``answered``, the run goes on for one more turn: the next model call carries the output as a
    blob of its request (the output is then sent twice, as the observation and as what the model saw).
    """
    run = recorded_run(4000 if not answered else 7000)
    tools = [message for message in run["messages"] if message["role"] == "tool"]
    line = "x" * int(megabytes * 1e6)
    tools[0]["content"] = f"<returncode>0</returncode>\n<output>\n{line}</output>"
    tools[0]["extra"]["raw_output"] = line
    return run


def bench_streaming(trials: tuple[int, ...] = JOB_TRIALS, line_mb: float = LINE_MB) -> dict[str, Any]:
    """Peak RSS of importing Harbor jobs of ``trials`` trials, and of a run with one ``line_mb`` MB line."""
    base_rss = _baseline_rss()
    jobs = []
    with tempfile.TemporaryDirectory() as directory:
        for count in trials:
            job = harbor_job(Path(directory), count)
            seconds, rss, sessions, quarantined = _measure_stream(job)
            jobs.append((count, sessions, seconds, rss))
            shutil.rmtree(job)
        path = Path(directory) / "large-line.traj.json"
        path.write_text(json.dumps(large_line_run(line_mb)))
        line_seconds, line_rss, _, _ = _measure_stream(path)
        _, plain_rss, _, _ = _measure_stream(path, redact=False)
        path.write_text(json.dumps(large_line_run(line_mb, answered=True)))
        _, answered_rss, _, _ = _measure_stream(path)
    print(f"streamed import; importer peak RSS with nothing imported: {base_rss / 1e6:.0f} MB")
    print(f"{'trials':>7} {'sessions':>8} {'seconds':>8} {'peak RSS MB':>11} {'(RSS-base) KiB/trial':>21}")
    for count, sessions, seconds, rss in jobs:
        per_trial = max(rss - base_rss, 0) / 1024 / count
        print(f"{count:7d} {sessions:8d} {seconds:8.2f} {rss / 1e6:11.0f} {per_trial:21.1f}")
    ratio = jobs[-1][3] / jobs[0][3]
    print(
        f"peak RSS, {jobs[-1][0]} trials vs {jobs[0][0]}: {ratio:.2f}x "
        f"(bounded by the largest trial: about 1; a job held whole grows {jobs[-1][0] / jobs[0][0]:.0f}x above the "
        "baseline)"
    )
    per_mb = (line_rss - base_rss) / 1e6 / line_mb
    plain_per_mb = (plain_rss - base_rss) / 1e6 / line_mb
    answered_per_mb = (answered_rss - base_rss) / 1e6 / line_mb
    print(
        f"one {line_mb:.0f} MB line: {line_seconds:.2f} s, peak RSS {line_rss / 1e6:.0f} MB, "
        f"{per_mb:.1f} MB above the baseline per MB of the line (redaction off: {plain_per_mb:.1f}; "
        f"the line answered by one more model call, which sends it again as a blob: {answered_per_mb:.1f})"
    )
    return {
        "jobs": jobs,
        "job_ratio": ratio,
        "line_rss_per_mb": per_mb,
        "line_rss_per_mb_unredacted": plain_per_mb,
        "line_rss_per_mb_answered": answered_per_mb,
        "base_rss": base_rss,
    }


def _load_only(queue: Any) -> None:
    import producers.importers  # noqa: F401 (what the import measurement also loads)
    from producers.redact.detector import detector_values

    # the secret detector's compiled rules, which every redacted import loads on its first trigger (the
    # first run on a machine compiles them into the detector's disk cache, so later children only load)
    detector_values("warm: ghp_" + "a1B2" * 9)
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def bench_import(sizes: tuple[float, ...] = SIZES_MB) -> dict[str, Any]:
    """Import runs of ``sizes`` MB and print time and peak RSS per MB, and the ratio largest / smallest."""
    rows = []
    base_rss = _baseline_rss()
    with tempfile.TemporaryDirectory() as directory:
        for size in sizes:
            path = Path(directory) / f"run-{size}.traj.json"
            path.write_text(json.dumps(recorded_run(int(size * 1e6))))
            megabytes = path.stat().st_size / 1e6
            seconds, rss, steps, events = measure(path)
            rows.append((megabytes, steps, events, seconds, rss))
            path.unlink()
    print(f"importer peak RSS with nothing imported: {base_rss / 1e6:.0f} MB")
    print(f"{'MB':>6} {'turns':>6} {'events':>7} {'seconds':>8} {'s/MB':>6} {'peak RSS MB':>11} {'(RSS-base)/MB':>13}")
    for megabytes, steps, events, seconds, rss in rows:
        print(
            f"{megabytes:6.1f} {steps:6d} {events:7d} {seconds:8.2f} {seconds / megabytes:6.2f} {rss / 1e6:11.0f} "
            f"{(rss - base_rss) / 1e6 / megabytes:13.1f}"
        )
    first, last = rows[0], rows[-1]
    time_ratio = (last[3] / last[0]) / (first[3] / first[0])
    memory_ratio = ((last[4] - base_rss) / last[0]) / max((first[4] - base_rss) / first[0], 1)
    print(
        f"time per MB, {last[0]:.1f} MB vs {first[0]:.1f} MB: {time_ratio:.2f}x; "
        f"memory per MB: {memory_ratio:.2f}x (1.0 is linear)"
    )
    return {"rows": rows, "time_ratio": time_ratio, "memory_ratio": memory_ratio, "base_rss": base_rss}
