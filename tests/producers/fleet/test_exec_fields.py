"""The executor's reply header is defined once, in the sandbox image's script, and the host reads it from there."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

import producers.fleet.sandbox.bwrap as bwrap
from producers.errors import SandboxError

IMAGE_EXEC = Path(bwrap.__file__).resolve().parents[1] / "image" / "tl_exec.py"


def test_the_host_parses_the_header_the_executor_writes() -> None:
    executor = runpy.run_path(str(IMAGE_EXEC), run_name="tl_exec_under_test")
    assert bwrap.EXEC_FIELDS == executor["FIELDS"]
    assert "EXEC_FIELDS = (" not in Path(bwrap.__file__).read_text()  # no second literal copy on the host


def test_a_script_without_the_tuple_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "exec.py"
    script.write_text("FIELDS = ['a', 'b']\nOTHER = ('x',)\n")
    with pytest.raises(SandboxError, match="FIELDS"):
        bwrap._literal_of(script, "FIELDS")
    assert bwrap._literal_of(script, "OTHER") == ("x",)
