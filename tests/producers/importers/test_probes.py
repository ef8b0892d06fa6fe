"""Probes of the import boundary its own fixtures did not cover: what a path can be, besides a recorded run.

The property: every path ends in sessions or in one line naming it, promptly; a device, a FIFO or a
socket is never read (reading one would block for ever, or never end, and fill memory).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from producers.importers import ImportFormatError, import_file, import_paths
from producers.importers.verdicts import read_verdicts

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "harbor_job/fix-git__Pq3Lm/agent/trajectory.json"


def _specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO no one writes to, links to endless and to blocking devices, a listening socket."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    tty = tmp_path / "tty.jsonl"
    tty.symlink_to("/dev/tty")
    sock = tmp_path / "s.json"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    return {"fifo": fifo, "zero": zero, "tty": tty, "socket": sock}


@pytest.mark.timeout(60)
def test_a_fifo_a_device_or_a_socket_is_refused_in_one_line_without_reading_it(tmp_path: Path) -> None:
    for kind, path in _specials(tmp_path).items():
        with pytest.raises(ImportFormatError) as caught:
            import_file(path)
        message = str(caught.value)  # "not a regular file", or the open itself refused (no terminal, a socket)
        assert str(path) in message and "\n" not in message, kind
        assert "not a regular file" in message or "cannot read file" in message, message
    with pytest.raises(ImportFormatError, match="not a regular file"):
        import_file("/dev/zero")


@pytest.mark.timeout(60)
def test_special_files_in_a_run_directory_leave_its_runs_imported(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(RUN, runs / "a.json")
    _specials(runs)
    report = import_paths([runs])
    assert len(report.summaries) == 1
    named = {Path(q.path).name for q in report.quarantined}
    assert {"fifo.json", "zero.json", "tty.jsonl", "s.json"} <= named, report.quarantined


@pytest.mark.timeout(60)
def test_a_harbor_trial_or_conversation_whose_files_are_fifos_is_quarantined(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    shutil.copytree(FIXTURES / "harbor_job/fix-git__Pq3Lm", trial)
    (trial / "result.json").unlink()
    os.mkfifo(trial / "result.json")  # the verdict beside it: a FIFO is no result
    result = import_file(trial)
    assert result.sessions and not result.quarantined
    conversation = tmp_path / "conv"
    (conversation / "events").mkdir(parents=True)
    os.mkfifo(conversation / "events" / "event-00000-x.json")
    result = import_file(conversation)
    assert not result.sessions
    assert [q.reason for q in result.quarantined] == [
        q.reason for q in result.quarantined if "not a regular file" in q.reason
    ]
    assert result.quarantined


@pytest.mark.timeout(60)
def test_verdicts_from_a_fifo_are_not_read(tmp_path: Path) -> None:
    reports = tmp_path / "eval"
    reports.mkdir()
    os.mkfifo(reports / "report.json")
    found, errors = read_verdicts(reports)
    assert found == []
