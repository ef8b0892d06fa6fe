#!/usr/bin/env bash
# The test suite on a fresh machine: a virtual environment with the project and its
# dev extras, OS packages the integration tests use (when run as root), lint, types, then pytest.
#   bash scripts/test.sh          the fast tier: every test not marked slow, e2e or stress (minutes)
#   bash scripts/test.sh --full   the full gate CI runs: every test but the stress runs, with coverage
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/quality`, `bash scripts/test.sh -m stress`).
# Warnings are errors in both ([tool.pytest.ini_options] filterwarnings).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow and not e2e and not stress" --durations=15)
if [ "${1:-}" = "--full" ]; then
  shift
  tier=(--durations=30 --cov --cov-report=term:skip-covered --cov-report=xml:.coverage.xml)
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "${tier[0]}" = "--durations=30" ]; then
  # the full gate also fine-tunes a tiny model on an export with TRL (the CUDA torch wheel: ~5 GB, ~100 s)
  .venv/bin/python -m pip install -q -e '.[dev,train]'
else
  .venv/bin/python -m pip install -q -e '.[dev]'
fi
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
exec .venv/bin/python -m pytest -q -n "${TRAJLAKE_TEST_WORKERS:-2}" --dist loadfile "${tier[@]}" "$@"
