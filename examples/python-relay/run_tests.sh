#!/usr/bin/env bash
# Installs the Python worker's requirements, generates its gRPC stubs from
# ../../proto and runs its tests against real PostgreSQL, RabbitMQ and outboxd
# (built with `cargo build`; override the binary with OUTBOXD_BIN).
# Extra arguments go to pytest. Exits non-zero on failure, and when no test ran.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

echo "== python-relay: pip install -r requirements.txt"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r requirements.txt

echo "== python-relay: generate stubs"
"$PYTHON" gen_stubs.py

echo "== python-relay: pytest"
status=0
"$PYTHON" -m pytest -q "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "FAIL: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
