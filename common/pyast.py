"""``ast.parse`` and ``ast.literal_eval`` that are safe to call from several threads at once.

CPython 3.11 (the race reproduces on 3.11.7; see tests/common/test_pyast.py) keeps the AST
constructor's recursion counter in one interpreter-wide state (python/cpython#106905 is about the
same counter). When two threads build Python AST objects at the same time — a garbage collection or
a thread switch in the middle of one ``ast.parse`` lets another one start — the counter is reset
under the first one's feet and the first call fails with
``SystemError: AST constructor recursion depth mismatch``. The local fleet judges sessions on a
thread pool, so its scans of submitted code parse concurrently.

Every parse in trajlake goes through here: one process-wide lock serialises the AST construction
(reentrant, so a finalizer that parses during a parse cannot deadlock), and a parse that still loses
the race against a caller outside trajlake is retried under the lock instead of failing a session.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["literal_eval", "parse"]

_LOCK = threading.RLock()
_MISMATCH = "AST constructor recursion depth mismatch"
_ATTEMPTS = 3
_T = TypeVar("_T")


def _serialised(build: Callable[[], _T]) -> _T:
    for _ in range(_ATTEMPTS - 1):
        try:
            with _LOCK:
                return build()
        except SystemError as error:
            if _MISMATCH not in str(error):
                raise
    with _LOCK:
        return build()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, serialised; raises what ``ast.parse`` raises."""
    return _serialised(lambda: ast.parse(source, filename))


def literal_eval(node_or_string: str | ast.AST) -> Any:
    """``ast.literal_eval``, with its parse serialised like :func:`parse`."""
    if isinstance(node_or_string, str):
        text = node_or_string.lstrip(" \t")
        node_or_string = _serialised(lambda: ast.parse(text, mode="eval"))
    return ast.literal_eval(node_or_string)
