#!/usr/bin/env bash
# The test suite on a fresh machine: a virtual environment with the project and its
# dev extras, OS packages the integration tests use (when run as root), then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
# OS packages the integration tests use: bubblewrap (real sandboxes), Java + Maven (real
# Apache Kafka built from Maven Central). Installed where we can (CI runs as root).
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# the sandbox hardening tests try egress with tools other than Python
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v nc >/dev/null 2>&1 || missing+=(netcat-openbsd)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
# PostgreSQL: the SQL-catalog tests start their own cluster with initdb/pg_ctl.
{ command -v initdb || ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the UI test renders Dagster in headless Chromium
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
    || echo "warning: could not install ${missing[*]}; the tests that need them will be skipped" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the packages typed throughout, the tests relaxed (pyproject.toml [tool.mypy])
# Two workers by default (pytest-xdist, whole files per worker, each worker with its own embedded
# broker and real Kafka): about half the serial time. TRAJLAKE_TEST_WORKERS=0 runs serially.
exec .venv/bin/python -m pytest -q -n "${TRAJLAKE_TEST_WORKERS:-2}" --dist loadfile "$@"
