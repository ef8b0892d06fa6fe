"""The two allocator policies: give each batch back (worker), or keep its pages for the next one (decoder)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter: mallopt settings are process-wide and cannot be undone.
_PROBE = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from pipelines import memory

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
