#!/usr/bin/env bash
# Create .venv and install kvstore with its CPU dependencies (torch 2.13.0 CPU build pinned here,
# so a GPU user's own torch in their own environment is left alone). Idempotent.
# Usage: scripts/setup.sh [EXTRAS]   e.g. scripts/setup.sh test
# Every step that can take more than a few seconds says so before it starts and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
log=.venv/setup.log

# step "what it does" command...: one line before, one after (with the seconds), the output in $log
step() {
  local what="$1" start=$SECONDS
  shift
  echo "setup: ${what}..."
  if ! "$@" >>"$log" 2>&1; then
    tail -40 "$log"
    echo "setup: ${what} failed; full log in $log" >&2
    exit 1
  fi
  echo "setup:   done in $((SECONDS - start)) s"
}

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv (python3 -m venv)"
  python3 -m venv .venv
fi
py=.venv/bin/python
stamp=".venv/.installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  : >"$log"
  if [ -n "$extras" ]; then spec=".[${extras}]"; else spec="."; fi
  echo "setup: installing kvstore${extras:+[$extras]} into .venv in three steps (log: $log)"
  echo "setup: upgrading pip in .venv"
  "$py" -m pip install -q --upgrade pip >>"$log" 2>&1 || echo "setup: (pip not upgraded; continuing)"
  step "1/3 torch 2.13.0, CPU build (about 200 MB, 900 MB unpacked; one to five minutes)" "$py" -m pip install -q torch==2.13.0
  step "2/3 kvstore${extras:+[$extras]} and its dependencies (numba, fastapi, uvicorn...; a minute or more)" \
    "$py" -m pip install -q -e "$spec"
  echo "setup: 3/3 checking the install"
  "$py" -c "import kvstore.cli" >>"$log" 2>&1 || { tail -20 "$log"; echo "setup: kvstore does not import; see $log" >&2; exit 1; }
  touch "$stamp"
else
  echo "setup: .venv is up to date (${stamp#.venv/})"
fi
# The chunk-key loops in C (kvstore/csrc/chunk_keys.c: a first lookup of a long prompt held as a Python
# list), with the system C compiler; cached by a hash of the sources, so a rerun is instant. Without a
# compiler the pure-Python keys run (same keys, slower first lookups) and one log line says so.
echo "setup: compiling the chunk-key loops in C (a few seconds; cached after)"
start=$SECONDS
if "$py" -m kvstore.native_keys >>"$log" 2>&1; then
  echo "setup:   done in $((SECONDS - start)) s"
else
  tail -5 "$log"
  echo "setup: warning: C build of the chunk keys failed (see $log); they run as pure Python"
fi
# The replay-hot eviction policies compiled with mypyc (policies/eviction/_native.py), when mypy (the
# test extras) and a C compiler are there; cached by a hash of the sources, so a rerun is instant.
if "$py" -c "import mypyc" 2>/dev/null; then
  echo "setup: compiling the eviction policies with mypyc (first time about a minute; cached after)"
  start=$SECONDS
  if "$py" -m policies.eviction.build_native; then
    echo "setup:   done in $((SECONDS - start)) s"
  else
    echo "setup: warning: mypyc build failed; the eviction policies run as pure Python"
  fi
else
  echo "setup: the eviction policies run as pure Python (compiled ones need the test extra: bash scripts/setup.sh test)"
fi
echo "setup: ready. Put kvstore on your PATH with: source .venv/bin/activate"
