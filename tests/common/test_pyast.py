"""Parsing Python from several threads at once never fails with CPython's AST recursion-depth SystemError.

The local fleet scans submitted code on a thread pool; on CPython 3.11 two ``ast.parse`` calls that overlap
(a garbage collection runs Python code mid-construction and the interpreter switches threads) corrupt a
shared counter and one of them raises ``SystemError: AST constructor recursion depth mismatch``. CI lost a
fleet run to it. The harness below provokes that overlap on purpose: a GC callback that yields the GIL,
collections every 200 allocations, the shortest switch interval, and threads parsing at different stack
depths.
"""

from __future__ import annotations

import ast
import gc
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import pyast

SOURCE = "\n".join(f"def f{i}(x):\n    return [y for y in range(x) if y % {i + 1}]" for i in range(40))
DEPTHS = (0, 15, 30, 45)


def _at_depth(depth: int, call: Callable[[], object]) -> object:
    return call() if depth == 0 else _at_depth(depth - 1, call)


@pytest.fixture
def contended():
    """GC during every AST build yields the GIL; the interpreter switches threads as often as it can."""
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()

    def yield_gil(phase: str, info: dict) -> None:
        time.sleep(0)

    gc.callbacks.append(yield_gil)
    gc.set_threshold(200)
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        gc.callbacks.remove(yield_gil)
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)


def _hammer(parse: Callable[[str], object], *, parses: int, budget_s: float) -> tuple[int, list[str]]:
    """Parse ``SOURCE`` from ``len(DEPTHS)`` threads until ``parses`` are done, one fails, or the budget ends."""
    done = [0]
    errors: list[str] = []
    stop = threading.Event()

    def work(depth: int) -> None:
        while not stop.is_set():
            try:
                _at_depth(depth, lambda: parse(SOURCE))
            except SystemError as error:
                errors.append(str(error))
                stop.set()
                return
            done[0] += 1
            if done[0] >= parses:
                stop.set()

    threads = [threading.Thread(target=work, args=(depth,)) for depth in DEPTHS]
    for thread in threads:
        thread.start()
    stop.wait(budget_s)
    stop.set()
    for thread in threads:
        thread.join()
    return done[0], errors


def test_the_harness_provokes_the_race_on_interpreters_that_have_it(contended):
    done, errors = _hammer(ast.parse, parses=1_000_000, budget_s=30)
    if not errors:
        pytest.skip(f"{sys.version.split()[0]}: {done} overlapping ast.parse calls, no mismatch (race fixed here)")
    assert "AST constructor recursion depth mismatch" in errors[0]


def test_overlapping_parses_through_pyast_never_fail(contended):
    done, errors = _hammer(pyast.parse, parses=1_500, budget_s=20)
    assert errors == []
    assert done >= 300, f"only {done} parses ran: the harness proved nothing"


def test_literal_eval_and_parse_keep_the_standard_contract():
    assert pyast.literal_eval("  {'a': [1, (2, 3)], 'b': -4.5}") == {"a": [1, (2, 3)], "b": -4.5}
    assert pyast.literal_eval(ast.parse("7", mode="eval").body) == 7
    with pytest.raises(ValueError):
        pyast.literal_eval("__import__('os')")
    with pytest.raises(SyntaxError):
        pyast.parse("def (:", "<bad>")
    module = pyast.parse("import a.b\nfrom c import d\n", "<imports>")
    assert isinstance(module, ast.Module) and len(module.body) == 2


def test_product_code_parses_only_through_pyast():
    """A direct ``ast.parse``/``ast.literal_eval`` of text in product code brings the race back."""
    root = Path(__file__).resolve().parents[2]
    packages = [p.parent for p in root.glob("*/__init__.py") if p.parent.name not in {"tests", "benchmarks"}]
    direct = []
    for path in sorted(f for package in packages for f in package.rglob("*.py")):
        if path == root / "common" / "pyast.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "ast"
                and node.func.attr in {"parse", "literal_eval"}
            ):
                direct.append(f"{path.relative_to(root)}:{node.lineno}: ast.{node.func.attr}")
    assert len(packages) >= 8
    assert direct == []


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.text(alphabet="()[]{}'\",:.+-*=0123456789 \t\nabcjx", max_size=80)))
def test_any_text_parses_or_fails_exactly_as_the_standard_library_does(text: str):
    """Generated text, mostly not Python: same tree or the same exception type as ``ast``."""
    for ours, theirs in ((pyast.parse, ast.parse), (pyast.literal_eval, ast.literal_eval)):
        try:
            expected: object = theirs(text)
        except Exception as error:
            with pytest.raises(type(error)):
                ours(text)
            continue
        got = ours(text)
        assert (ast.dump(got) if isinstance(got, ast.AST) else repr(got)) == (
            ast.dump(expected) if isinstance(expected, ast.AST) else repr(expected)
        )
