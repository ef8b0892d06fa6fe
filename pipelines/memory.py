"""Keeping a process's resident memory close to what it holds (large, short-lived Arrow batches)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

import pyarrow as pa

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def bound_allocator() -> None:
    """Arrow on the system allocator, with few malloc arenas; call before starting threads.

    Batches are large, short-lived Arrow buffers: with few arenas and a trim after each
    batch (:func:`release_free_memory`), freed batches go back to the OS instead of
    staying in allocator caches.
    """
    # A fixed threshold: glibc would otherwise raise it (up to 32 MB) after the first large
    # free, after which multi-MB record buffers land in the heap and fragment it.
    _system_allocator(mmap_threshold=1 << 20)


def reusing_allocator() -> None:
    """Arrow on the system allocator, keeping freed pages for the next batch of the same shape.

    For a process that handles one batch at a time and whose working set is the same each
    time (the decoder). Returning a batch's pages to the OS and faulting them back in for the
    next one cost the decoder ~1.2 page faults (~5 µs of system time) per event here. Buffers
    up to glibc's largest mmap threshold (32 MB) come from the heap, and the heap is not
    trimmed on its own; :func:`release_free_memory` with ``above`` bounds what it keeps.
    """
    _system_allocator(mmap_threshold=32 << 20, trim_threshold=1 << 30)


def _system_allocator(mmap_threshold: int, trim_threshold: int | None = None) -> None:
    """Arrow on the system allocator with two malloc arenas and the given thresholds (glibc only)."""
    pa.set_memory_pool(pa.system_memory_pool())
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_ARENA_MAX, 2)
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)
        if trim_threshold is not None:
            libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)


def resident_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def release_free_memory(above: int = 0) -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``), when more than ``above`` bytes are resident."""
    if above and resident_bytes() <= above:
        return
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
