"""``trajlake ui``'s environment for Dagster: a Host-header guard on the webserver, a quiet console.

The guard is checked on the ASGI app built from the guarded middleware (every generated Host that is
not one of the UI's own names is refused), and through the start-up hook in a fresh interpreter, as
Dagster's webserver process gets it. The real webserver behind ``trajlake ui``: tests/dagster_project/test_ui.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from trajlake.ui_env import DAGSTER_YAML, HOSTS_ENV, UI_HOSTS, guard_webserver, prepare_dagster_home, ui_environment


class _Webserver:
    """Stands in for ``DagsterWebserver``: the guard extends whatever middleware the class builds."""

    def build_middleware(self) -> list[Middleware]:
        return []


guard_webserver(_Webserver, UI_HOSTS)
APP = Starlette(
    routes=[Route("/server_info", lambda _: PlainTextResponse("ok"))], middleware=_Webserver().build_middleware()
)


def _status(host: bytes | None, scope_type: str = "http") -> int:
    """The status the guarded app answers a GET with this Host header (None: no Host header)."""
    headers = [(b"host", host)] if host is not None else []
    scope = {
        "type": scope_type,
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/server_info",
        "raw_path": b"/server_info",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 3000),
    }
    sent: list[dict] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(APP(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_its_own_names_are_answered_with_any_port() -> None:
    for host in (b"127.0.0.1", b"127.0.0.1:3000", b"localhost", b"localhost:8080", b"LOCALHOST:3000"):
        assert _status(host) == 200, host


def test_a_rebinding_page_s_host_is_refused() -> None:
    for host in (
        b"evil.example",
        b"evil.example:3000",
        b"127.0.0.1.evil.example",
        b"localhost.evil.example",
        b"",
        None,
    ):
        assert _status(host) == 400, host


@settings(max_examples=200, deadline=None)
@given(
    st.binary(min_size=1, max_size=40).filter(lambda b: b.split(b":")[0].lower() not in {b"127.0.0.1", b"localhost"})
)
def test_every_other_host_header_is_refused(host: bytes) -> None:
    assert _status(host) == 400


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # two interpreters importing Dagster's webserver
def test_the_start_up_hook_guards_dagster_s_webserver_and_nothing_without_the_hosts(tmp_path: Path) -> None:
    code = (
        "import dagster_webserver.webserver as w\n"
        "print(' '.join(type(m.cls).__name__ if not isinstance(m.cls, type) else m.cls.__name__ "
        "for m in w.DagsterWebserver.build_middleware(None)))\n"
    )
    env = ui_environment({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    guarded = _python(code, env)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.split() == ["TrustedHostMiddleware", "DagsterTracedCounterMiddleware"]
    unguarded = _python(code, {k: v for k, v in env.items() if k != HOSTS_ENV})
    assert unguarded.stdout.split() == ["DagsterTracedCounterMiddleware"]


def test_the_start_up_hook_silences_dagster_s_supersession_warning_only(tmp_path: Path) -> None:
    code = (
        "import warnings\n"
        "warnings.warn('Function `dev_command` is superseded and its usage is discouraged.', FutureWarning)\n"
        "warnings.warn('another warning', FutureWarning)\n"
    )
    env = ui_environment({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    quiet = _python(code, env)
    assert "superseded" not in quiet.stderr and "another warning" in quiet.stderr
    plain = _python(code, {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert "superseded" in plain.stderr


def test_dagster_home_gets_telemetry_off_and_an_existing_config_is_kept(tmp_path: Path) -> None:
    home = prepare_dagster_home(tmp_path / "dagster")
    assert (home / "dagster.yaml").read_text() == DAGSTER_YAML
    assert home.stat().st_mode & 0o077 == 0
    import yaml

    assert yaml.safe_load(DAGSTER_YAML) == {"telemetry": {"enabled": False}}
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    prepare_dagster_home(home)
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"


def test_the_environment_s_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.OWN_HOOK_RAN = True\n")
    env = ui_environment({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(own)})
    code = (
        "import builtins, sys\n"
        "print(getattr(builtins, 'OWN_HOOK_RAN', False), "
        "any(type(f).__name__ == '_GuardOnImport' for f in sys.meta_path))\n"
    )
    assert _python(code, env).stdout.split() == ["True", "True"]  # theirs and ours
