#!/usr/bin/env bash
# Install fsspec-kbs with every extra into a fresh virtual environment and run the whole test
# suite against real services: moto S3, fake-gcs-server, Azurite (npm, pinned by
# scripts/azurite/package-lock.json, installed into .cache/azurite), a local Spark session and an
# Apache Kafka broker (scripts/kafka.sh fetches its jars from Maven Central and starts it on loopback).
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
bash scripts/spark_kafka_jars.sh >/dev/null
# Azurite for the azure tests: npm ci from the committed lock, only when .cache/azurite does not
# already hold exactly that lock (tests/fixtures/azure.py finds it there and skips without node).
AZURITE_DIR=.cache/azurite
if ! command -v npm >/dev/null; then
    echo "test.sh: npm not found, the azure tests will skip" >&2
elif [[ ! -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]] \
        || ! cmp -s scripts/azurite/package-lock.json "$AZURITE_DIR/package-lock.json"; then
    mkdir -p "$AZURITE_DIR"
    cp scripts/azurite/package.json scripts/azurite/package-lock.json "$AZURITE_DIR/"
    npm ci --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error
fi
"$VENV/bin/ruff" check fsspec_kbs tests benchmarks examples
# The README's main job, as a newcomer runs it (in a scratch directory: it writes ./kbs-demo).
DEMO_DIR="$(mktemp -d)"
(cd "$DEMO_DIR" && "$KBS_PYTHON" "$OLDPWD/examples/quickstart.py" >/dev/null)
rm -rf "$DEMO_DIR"
exec "$VENV/bin/python" -m pytest -ra "$@"
