"""A tiny test runner shipped in every task image (stdlib only; the sandbox has no pytest).

Usage: ``python3 tl_test.py [DIR ...] [--root DIR] [--json]``. Imports every ``test_*.py`` in
each DIR (default ``tests``) with ROOT (default the current directory) first on ``sys.path``,
calls every ``test_*`` function, and prints one line per test in the style named by
``TL_OUTPUT_STYLE`` (plain, pytest, tap, json: environment perturbation varies it), then a
summary. ``--json`` adds a final ``TL_RESULT {...}`` line for the evaluator. Exit status 0 only
when at least one test ran and all passed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback


def discover(directory: str) -> list[str]:
    """Test files of ``directory``, sorted."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if n.startswith("test_") and n.endswith(".py")]


def run_file(path: str) -> list[tuple[str, bool, str]]:
    """Run every test function of one file: (name, passed, message)."""
    results: list[tuple[str, bool, str]] = []
    name = "tl_" + os.path.basename(path)[:-3]
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException as exc:  # a broken test file is a failed test
        return [(os.path.basename(path), False, f"import error: {type(exc).__name__}: {exc}")]
    for attr in sorted(vars(module)):
        func = getattr(module, attr)
        if attr.startswith("test_") and callable(func):
            try:
                func()
                results.append((attr, True, ""))
            except BaseException as exc:
                line = traceback.format_exception_only(type(exc), exc)[-1].strip()
                results.append((attr, False, line))
    return results


def main(argv: list[str]) -> int:
    """Run the tests named by ``argv``; the process exit status."""
    want_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    root = os.getcwd()
    if "--root" in args:
        index = args.index("--root")
        root = args[index + 1]
        del args[index : index + 2]
    sys.path.insert(0, root)
    os.chdir(root)
    started = time.monotonic()
    results: list[tuple[str, bool, str]] = []
    for directory in args or ["tests"]:
        for path in discover(directory):
            results.extend(run_file(path))
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    elapsed = time.monotonic() - started
    style = os.environ.get("TL_OUTPUT_STYLE", "plain")
    if style == "pytest":
        print("".join("." if ok else "F" for _, ok, _ in results))
        for name, ok, msg in results:
            if not ok:
                print(f"FAILED {name} - {msg}")
        summary = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
        print(f"{summary} in {elapsed:.2f}s")
    elif style == "tap":
        print(f"1..{len(results)}")
        for i, (name, ok, msg) in enumerate(results, 1):
            print(f"{'ok' if ok else 'not ok'} {i} - {name}" + (f" # {msg}" if msg else ""))
    elif style == "json":
        print(json.dumps({"tests": [{"name": n, "ok": ok, "message": m} for n, ok, m in results]}))
    else:
        for name, ok, msg in results:
            print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {msg}" if msg else ""))
        print(f"== {passed} passed, {failed} failed ==")
    if want_json:
        print("TL_RESULT " + json.dumps({"total": len(results), "passed": passed, "failed": failed}))
    return 0 if results and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
