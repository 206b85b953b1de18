#!/usr/bin/env bash
# Installs the Python worker's requirements into a virtual environment of its
# own (target/python-relay-venv; never the system's Python), generates its gRPC
# stubs from ../../proto and runs its tests against real PostgreSQL, RabbitMQ
# and outboxd (built with `cargo build`; override the binary with OUTBOXD_BIN).
# PYTHON picks the interpreter the environment is made from (default python3).
# Extra arguments go to pytest. Exits non-zero on failure, and when no test ran.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${PYTHON_RELAY_VENV:-../../target/python-relay-venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "== python-relay: python -m venv $VENV"
  "${PYTHON:-python3}" -m venv "$VENV" || {
    echo "FATAL: cannot create a Python virtual environment (on Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
PYTHON="$VENV/bin/python"

echo "== python-relay: pip install -r requirements.txt (into $VENV)"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -r requirements.txt

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
