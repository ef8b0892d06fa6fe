"""Keeping a process's resident memory close to what it holds (large, short-lived Arrow batches)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import pyarrow as pa


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
    pa.set_memory_pool(pa.system_memory_pool())
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-8, 2)  # M_ARENA_MAX
        # A fixed threshold: glibc would otherwise raise it (up to 32 MB) after the first large
        # free, after which multi-MB record buffers land in the heap and fragment it.
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


def release_free_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
