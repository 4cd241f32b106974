#!/usr/bin/env bash
# Create .venv and install kvstore with its CPU dependencies (torch 2.13.0 CPU build pinned here,
# so a GPU user's own torch in their own environment is left alone). Idempotent.
# Usage: scripts/setup.sh [EXTRAS]   e.g. scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
py=.venv/bin/python
stamp=".venv/.installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log=.venv/setup.log
  if [ -n "$extras" ]; then spec=".[${extras}]"; else spec="."; fi
  echo "installing kvstore${extras:+[$extras]} into .venv (log: $log)"
  { "$py" -m pip install -q --upgrade pip || true
    "$py" -m pip install -q torch==2.13.0 && "$py" -m pip install -q -e "$spec"; } >"$log" 2>&1 \
    || { tail -40 "$log"; echo "setup failed; full log in $log" >&2; exit 1; }
  touch "$stamp"
fi
# The replay-hot eviction policies compiled with mypyc (policies/eviction/_native.py), when mypy (the
# test extras) and a C compiler are there; cached by a hash of the sources, so a rerun is instant.
if "$py" -c "import mypyc" 2>/dev/null; then
  "$py" -m policies.eviction.build_native \
    || echo "warning: mypyc build failed; the eviction policies run as pure Python"
fi
