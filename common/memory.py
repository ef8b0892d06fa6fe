"""Keeping a process's resident memory close to what it holds (large, short-lived Arrow batches)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from collections.abc import Iterator
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


#: Container allocations between collections of the youngest generation inside :func:`steady_gc`
#: (CPython's default is 700). docs/performance.md ("Ingest cost per event") gives the measurements.
STEADY_GC_GEN0 = 50_000
_steady_lock = threading.Lock()
_steady_depth = 0
_steady_saved: tuple[int, int, int] | None = None
_steady_froze = False


@contextlib.contextmanager
def steady_gc(gen0: int = STEADY_GC_GEN0) -> Iterator[None]:
    """Cyclic garbage collection fitted to a loop over large batches, for the duration of the block.

    What is alive when the loop starts (modules, schemas, the catalog: ~150,000 objects in an
    ingest worker) is moved out of the collector's reach with ``gc.freeze()``, so the full
    collections a long run still makes traverse only what the loop allocated; and the youngest
    generation is collected every ``gen0`` container allocations instead of every 700 (a poll of
    10,000 Kafka records allocates a timestamp tuple each, and each collection then walked the
    records still held). Reference counting frees everything as before; only reference cycles
    wait longer. Without this the collector took ~10 % of an ingest worker's CPU.

    On leaving, the objects are handed back to the collector and the thresholds restored (blocks
    may nest, or run in several threads: the outermost exit restores). A process that froze
    objects itself (a forked child, :mod:`warehouse.isolation`) keeps them frozen: only the
    threshold changes there.
    """
    global _steady_depth, _steady_saved, _steady_froze
    with _steady_lock:
        if _steady_depth == 0:
            _steady_saved = gc.get_threshold()
            _steady_froze = gc.get_freeze_count() == 0
            if _steady_froze:
                gc.freeze()
            gc.set_threshold(max(gen0, _steady_saved[0]), *_steady_saved[1:])
        _steady_depth += 1
    try:
        yield
    finally:
        with _steady_lock:
            _steady_depth -= 1
            if _steady_depth == 0 and _steady_saved is not None:
                gc.set_threshold(*_steady_saved)
                if _steady_froze:
                    gc.unfreeze()
                _steady_saved, _steady_froze = None, False
