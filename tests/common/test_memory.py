"""The two allocator policies: give each batch back (worker), or keep its pages for the next one (decoder)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

# Runs in a fresh interpreter: mallopt settings are process-wide and cannot be undone.
_PROBE = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from common import memory

    getattr(memory, sys.argv[1])()
    mib = 1 << 20
    base = memory.resident_bytes()
    # 24 buffers of 8 MiB, written to so their pages are resident, then freed.
    buffers = [pa.allocate_buffer(8 * mib) for _ in range(24)]
    for buffer in buffers:
        memoryview(buffer).cast("B")[:: 4096] = b"x" * (8 * mib // 4096)
    held = memory.resident_bytes()
    del buffers
    freed = memory.resident_bytes()
    memory.release_free_memory(above=held * 4)
    kept_under_bound = memory.resident_bytes()
    memory.release_free_memory(above=(freed + base) // 2)
    trimmed = memory.resident_bytes()
    print(json.dumps({k: v / mib for k, v in dict(
        base=base, held=held, freed=freed, kept_under_bound=kept_under_bound, trimmed=trimmed).items()}))
    """
)


def _probe(policy: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _PROBE, policy], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc and /proc/self/statm")
def test_bound_allocator_gives_freed_batches_back_at_once() -> None:
    mib = _probe("bound_allocator")
    assert mib["held"] - mib["base"] > 150  # the probe's buffers were resident
    assert mib["freed"] - mib["base"] < 40  # 8 MiB buffers are mmapped and unmapped on free


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc and /proc/self/statm")
def test_reusing_allocator_keeps_pages_until_over_its_bound() -> None:
    mib = _probe("reusing_allocator")
    assert mib["held"] - mib["base"] > 150
    # Freed buffers stay resident for the next batch, and a trim under the bound keeps them too ...
    assert mib["freed"] - mib["base"] > 150
    assert mib["kept_under_bound"] - mib["base"] > 150
    # ... until the process holds more than the bound: then they go back to the OS.
    assert mib["trimmed"] - mib["base"] < 40


# -- steady_gc: the collector during a long batch loop ------------------------------------

_GC_PROBE = textwrap.dedent(
    """
    import gc, json, sys, threading, weakref
    from common.memory import steady_gc

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    if sys.argv[1] == "prefrozen":
        gc.freeze()  # as a forked child that must not collect its parent's objects
    out = {"before": gc.get_threshold(), "frozen_before": gc.get_freeze_count()}
    with steady_gc(gen0=5_000):
        out["inside"] = gc.get_threshold()
        out["frozen_inside"] = gc.get_freeze_count()
        with steady_gc(gen0=9_000):
            out["nested"] = gc.get_threshold()
        out["after_nested"] = gc.get_threshold()
        # a cycle made inside the block is still collected once enough containers were allocated
        dead = cycle()
        keep = [[i] for i in range(20_000)]
        out["cycle_collected"] = dead() is None
        del keep
    out["after"] = gc.get_threshold()
    out["frozen_after"] = gc.get_freeze_count()
    print(json.dumps(out))
    """
)


def _gc_probe(mode: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _GC_PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_steady_gc_freezes_what_was_alive_and_restores_the_collector_on_exit() -> None:
    out = _gc_probe("plain")
    assert out["frozen_before"] == 0
    assert out["frozen_inside"] > 1_000  # the interpreter's and common.memory's objects
    assert out["inside"] == [5_000, *out["before"][1:]]
    assert out["nested"] == out["inside"]  # only the outermost block sets and restores
    assert out["after_nested"] == out["inside"]
    assert out["cycle_collected"]  # reference cycles still die inside the block
    assert out["after"] == out["before"]
    assert out["frozen_after"] == 0


def test_steady_gc_leaves_a_process_s_own_freeze_alone() -> None:
    out = _gc_probe("prefrozen")
    assert out["frozen_before"] > 0
    assert out["inside"][0] == 5_000
    assert out["frozen_after"] == out["frozen_before"]  # not thawed: that freeze was not ours
    assert out["after"] == out["before"]
