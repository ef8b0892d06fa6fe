"""The sandbox host's limits: a disk quota per sandbox, bounded scans and bounded events with summaries.

Real local sessions whose agents write past their quota (bytes, then inodes) in every quota mode
this host can run end as ``failed``/``disk_quota`` with the host unharmed; a flood of files costs
a bounded number of events, each left-out part summarised, and an edited test inside the flood is
still recorded.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pytest

from common.settings import load_settings
from producers.fleet import ListSink, run_fleet
from producers.fleet.sandbox import ImageStore, Limits, Sandbox, bwrap_available
from producers.fleet.sandbox.quota import loop_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")

QUOTA = 24 << 20
MODES = ["accounting"] + (["tmpfs"] if os.geteuid() == 0 else []) + (["loop"] if loop_available() else [])


def write_past_the_quota(session) -> None:
    """Twice the quota in one file, then more commands as if nothing happened."""
    session.run(f"head -c {2 * QUOTA} /dev/zero > big.bin; echo rc=$?")
    session.run("echo still here > after.txt")


def many_files(session) -> None:
    """More files than the layer has inodes."""
    session.run("mkdir -p d && cd d && i=0; while [ $i -lt 3000 ]; do : > f$i; i=$((i+1)); done; echo made $i")
    session.run("echo still here > after.txt")


def _settings(tmp_path, **overrides):
    values = {"sandbox_disk_bytes": QUOTA, "sandbox_disk_inodes": 1024, "sandbox_tmp_bytes": 8 << 20}
    return load_settings(home=tmp_path / "home", **{**values, **overrides})


def _end(events):
    return next(e for e in events if e["event_type"] == "session_end")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agent", ["write_past_the_quota", "many_files"])
def test_past_the_quota_the_session_ends_and_the_host_is_unharmed(mode, agent, tmp_path):
    settings = _settings(tmp_path, sandbox_disk_quota=mode)
    free_before = shutil.disk_usage(tmp_path).free
    sink = ListSink()
    run_fleet(settings, "local", 1, seed=5, sink=sink, agent=f"{__name__}:{agent}", timeout_s=120)
    end = _end(sink.events)
    assert (end["payload"]["status"], end["payload"]["exit_reason"]) == ("failed", "disk_quota"), end
    assert "disk_quota_reached" in end["extra"]
    commands = [e["payload"]["command"] for e in sink.events if e["event_type"] == "agent_action"]
    assert not any("still here" in c for c in commands)  # nothing more ran on a full layer
    notes = [e["payload"]["key"] for e in sink.events if e["event_type"] == "annotation"]
    assert "disk_quota" in notes
    if mode != "accounting":  # a hard limit: the write itself failed inside the sandbox
        outputs = "".join(e["payload"]["output"] for e in sink.events if e["event_type"] == "env_feedback")
        assert "No space left on device" in outputs or "rc=1" in outputs
        written = max((e["payload"]["size_bytes"] for e in sink.events if e["event_type"] == "file_op"), default=0)
        assert written <= QUOTA
    # the host: the layer is gone, and the run cost it no more disk than the quota (plus slack for other writers)
    assert list((settings.home_dir / "fleet" / "sandboxes").iterdir()) == []
    assert free_before - shutil.disk_usage(tmp_path).free < 2 * QUOTA + (64 << 20)


def flood_with_an_edited_test(session) -> None:
    """Edits a visible test inside a flood of new files, in one command; then a few more commands."""
    session.run(
        "mkdir -p junk && cd junk && i=0; while [ $i -lt 1500 ]; do echo x > a$i; i=$((i+1)); done; cd ..;"
        " echo 'def test_ok():\n    assert True' > tests/test_visible.py"
    )
    for _ in range(4):
        session.run("i=0; while [ $i -lt 100 ]; do echo y >> junk/a$i; i=$((i+1)); done")


@pytest.mark.slow
def test_a_flood_of_files_costs_bounded_events_with_summaries(tmp_path):
    settings = _settings(
        tmp_path,
        sandbox_disk_quota="off",
        sandbox_file_ops_per_command=50,
        sandbox_events_per_session=120,
        sandbox_scan_entries=1000,
    )
    sink = ListSink()
    run_fleet(settings, "local", 1, seed=6, sink=sink, agent=f"{__name__}:flood_with_an_edited_test", timeout_s=120)
    events = sorted(sink.events, key=lambda e: e["seq"])
    assert [e["seq"] for e in events] == list(range(len(events)))  # gapless: what is left out takes no seq
    kinds = Counter(e["event_type"] for e in events)
    assert len(events) <= 120 + 6 and kinds["session_end"] == kinds["evaluation"] == 1
    notes = {e["payload"]["key"]: json.loads(e["payload"]["value"]) for e in events if e["event_type"] == "annotation"}
    # the flood command: 50 file ops, the rest summed up; the scan stopped at its bound and said so
    assert notes["file_ops_not_emitted"]["limit"] == 50 and sum(notes["file_ops_not_emitted"]["not_emitted"].values())
    assert notes["workspace_scan_incomplete"]["stopped_by"] == "entries"
    # the session's budget: the rest counted, summed up once before session_end
    assert notes["events_not_emitted"]["limit"] == 120 and notes["events_not_emitted"]["total"] > 0
    summary = next(e for e in events if e["event_type"] == "annotation" and e["payload"]["key"] == "events_not_emitted")
    assert summary["seq"] == _end(events)["seq"] - 1
    paths = [e["payload"]["path"] for e in events if e["event_type"] == "file_op"]
    assert "/workspace/tests/test_visible.py" in paths  # the edited test is never among what is left out
    end = _end(events)
    assert int(end["extra"]["file_ops_not_emitted"]) > 0 and int(end["extra"]["workspace_scans_incomplete"]) >= 1


def test_tmp_and_shared_memory_are_bounded_and_dev_is_read_only(tmp_path):
    image = ImageStore(tmp_path / "images").ensure("trajlake/test", "1.0.0")
    box = Sandbox("tmp", tmp_path / "sb", image, {}, Limits(tmp_bytes=4 << 20, disk_quota="off"))
    try:
        for where in ("/tmp", "/dev/shm"):
            result = box.run(f"head -c 10000000 /dev/zero > {where}/big; echo rc=$?; stat -c %s {where}/big")
            assert "rc=1" in result.output and int(result.output.split()[-1]) <= 4 << 20, where
        assert "Read-only" in box.run("echo x > /dev/elsewhere").output  # bwrap's /dev is as large as the host
        assert box.run("echo x > /dev/null && echo ok").output == "ok\n"
    finally:
        box.stop()
        box.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a layer needs a root host")
def test_layers_a_crashed_host_left_mounted_are_swept(tmp_path):
    import subprocess

    from producers.fleet.local import LocalFleet
    from producers.fleet.sandbox.quota import WorkspaceQuota

    dead = subprocess.Popen(["true"])
    dead.wait()
    root = tmp_path / "fleet" / "sandboxes"
    stale, live = root / "sb-stale", root / "sb-live"
    quotas = []
    for directory, pid in ((stale, dead.pid), (live, os.getpid())):
        directory.mkdir(parents=True)
        (directory / "owner").write_text(str(pid))
        quotas.append(WorkspaceQuota(directory / "workspace", directory / "disk.img", 8 << 20, 256, "tmpfs"))
        (directory / "workspace" / "data").write_text("x")
    try:
        LocalFleet(tmp_path / "fleet")
        assert not stale.exists()  # unmounted and removed: its owner is gone
        assert (live / "workspace" / "data").exists()  # this process's own sandbox is left alone
    finally:
        for quota in quotas:
            quota.release()
