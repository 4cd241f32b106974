#!/usr/bin/env bash
# Everything the tests need, on a fresh machine: venv, packages, redis-server; then lint and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
      || echo "warning: could not install redis-server; redis tests will be skipped"
  else
    echo "warning: redis-server not found; redis tests will be skipped"
  fi
fi
.venv/bin/ruff check kvstore tiers policies connector gpu_kernels service bench tests
.venv/bin/mypy kvstore tiers policies connector gpu_kernels service
exec .venv/bin/python -m pytest -q "$@"
