#!/usr/bin/env bash
# Install fsspec-kbs with every extra into a fresh virtual environment and run the whole test
# suite against real services: moto S3, fake-gcs-server, a local Spark session and an Apache
# Kafka broker (scripts/kafka.sh fetches its jars from Maven Central and starts it on loopback).
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -m "not kafka and not spark"   # extra pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KBS_VENV:-.venv}"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[all,test]"
export KBS_PYTHON="$PWD/$VENV/bin/python"
bash scripts/kafka.sh fetch
"$VENV/bin/ruff" check fsspec_kbs tests benchmarks examples
exec "$VENV/bin/python" -m pytest -ra "$@"
