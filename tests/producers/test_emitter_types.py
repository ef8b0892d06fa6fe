"""Events built through ``SessionEmitter.emit`` are checked against the schema's TypedDicts by mypy.

A payload with a misspelt field, a field of the wrong type or a missing required field is a type
error where the event is built; the same call with the right fields type-checks. Runs mypy on a
small module with the project's configuration.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CALLS = {
    "right": 'emitter.emit("session_end", {"status": "completed", "runtime_s": 1.0, "exit_reason": "x"}, "system")',
    "misspelt": 'emitter.emit("session_end", {"status": "completed", "runtime_s": 1.0, "exit_reson": "x"}, "system")',
    "mistyped": 'emitter.emit("network_request", {"host": "h", "port": "80", "allowed": False}, "system")',
    "missing": 'emitter.emit("file_op", {"path": "/workspace/x"}, "environment")',
    "wrong_source": 'emitter.emit("annotation", {"key": "k", "value": "v"}, "sandbox")',
    "unknown_kind": 'emitter.emit("sesion_end", {"status": "completed", "runtime_s": 1.0}, "system")',
}


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> dict[str, str]:
    from mypy import api

    directory = tmp_path_factory.mktemp("typed")
    for name, call in CALLS.items():
        (directory / f"call_{name}.py").write_text(
            textwrap.dedent(f"""\
                from producers.emitter import SessionEmitter

                emitter = SessionEmitter(print, task_id="t", task_type="bugfix")
                {call}
            """)
        )
    files = [str(directory / f"call_{name}.py") for name in CALLS]
    out, _, _ = api.run(
        [*files, "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(directory / ".cache")]
    )
    return {name: "\n".join(line for line in out.splitlines() if f"call_{name}.py" in line) for name in CALLS}


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"right"}))
def test_a_wrong_payload_is_a_type_error(mypy_errors, name):
    assert "error" in mypy_errors[name], mypy_errors[name]


def test_the_right_payload_type_checks(mypy_errors):
    assert mypy_errors["right"] == ""
