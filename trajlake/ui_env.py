"""The environment ``trajlake ui`` gives Dagster: its own host names only, a quiet console, a dagster.yaml.

**Host names.** A web page on ``evil.example`` can make the browser resolve that name to 127.0.0.1
(DNS rebinding) and then read and drive any server on the loopback port it names, the browser believing
it talks to ``evil.example``. Such requests carry ``Host: evil.example``: a server that answers only to
its own names (``127.0.0.1``, ``localhost``) refuses them (400 ``Invalid host header``). Dagster's
webserver has no such option, and ``dagster dev`` starts it as ``python -m dagster_webserver``, so
``trajlake ui`` puts :data:`STARTUP_DIR` first on the ``PYTHONPATH`` of the processes it starts and names
the allowed hosts in :data:`HOSTS_ENV`; the ``sitecustomize`` there calls :func:`install`, which adds
Starlette's ``TrustedHostMiddleware`` to the webserver's middleware when its module is imported (no
other module is imported or changed, and nothing happens in a process whose environment lacks
:data:`HOSTS_ENV`).

**Console.** The same start-up hook ignores Dagster's warning that ``dagster dev`` is superseded (by
``dg dev``, another package); :func:`prepare_dagster_home` writes a ``dagster.yaml`` with telemetry off
(Dagster otherwise prints its telemetry notice and a warning that the file is missing).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: Host names ``trajlake ui`` answers to (it binds 127.0.0.1 only); ports are not part of the check.
UI_HOSTS = ("127.0.0.1", "localhost")
#: Comma-separated host names the webserver answers to; set by ``trajlake ui`` for its processes.
HOSTS_ENV = "TRAJLAKE_UI_ALLOWED_HOSTS"
#: The directory holding the ``sitecustomize`` that calls :func:`install` (first on PYTHONPATH).
STARTUP_DIR = Path(__file__).resolve().parent / "ui_startup"
#: The module defining the webserver class whose middleware is extended.
_TARGET = "dagster_webserver.webserver"


def guard_webserver(cls: Any, hosts: Sequence[str]) -> None:
    """Make ``cls`` (``DagsterWebserver``) build its app with a Host-header check first in line."""
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    built = cls.build_middleware

    def build_middleware(self: Any) -> list[Middleware]:
        return [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)), *built(self)]

    cls.build_middleware = build_middleware


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Finds :data:`_TARGET` with the other finders and guards its webserver class once it has run."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = tuple(hosts)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = self._guarding(spec.loader.exec_module)  # type: ignore[method-assign]
                return spec
        return None

    def _guarding(self, run: Any) -> Any:
        def exec_module(module: ModuleType) -> None:
            run(module)
            guard_webserver(module.DagsterWebserver, self.hosts)

        return exec_module


def install(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Guard the webserver of this process if :data:`HOSTS_ENV` names hosts; whether it did."""
    hosts = [h.strip().lower() for h in environ.get(HOSTS_ENV, "").split(",") if h.strip()]
    if not hosts or any(isinstance(f, _GuardOnImport) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _GuardOnImport(hosts))
    return True


#: The instance configuration ``trajlake ui`` writes when DAGSTER_HOME has none (storage stays the default:
#: SQLite files under DAGSTER_HOME).
DAGSTER_YAML = "# written by `trajlake ui`: no usage statistics, no telemetry notice\ntelemetry:\n  enabled: false\n"
#: Warnings the start-up hook ignores in Dagster's processes (a message prefix each).
QUIET_WARNINGS = ("Function `dev_command` is superseded",)


def prepare_dagster_home(path: Path) -> Path:
    """Create DAGSTER_HOME (private) with a ``dagster.yaml`` turning telemetry off; an existing one is kept."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    return path


def quiet_warnings() -> None:
    """Ignore :data:`QUIET_WARNINGS` in this process."""
    import re
    import warnings

    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message))


def ui_environment(env: dict[str, str], hosts: Sequence[str] = UI_HOSTS) -> dict[str, str]:
    """``env`` for ``dagster dev``'s process tree: the startup directory first on PYTHONPATH, the hosts named."""
    path = [str(STARTUP_DIR), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "PYTHONPATH": os.pathsep.join(path), HOSTS_ENV: ",".join(hosts)}
