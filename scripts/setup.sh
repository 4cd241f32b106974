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
# A build beside the sources that no longer matches them (sources changed since the install: a pull, an edit)
# runs as pure Python; reinstalling rebuilds it.
stale() {
  "$py" -c "import sys; from kvstore import native_keys as k; from policies.eviction import _native as p
sys.exit(0 if 'stale' in (k.build_state(), p.build_state()) else 1)" 2>/dev/null
}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || stale; then
  : >"$log"
  if [ -n "$extras" ]; then spec=".[${extras}]"; else spec="."; fi
  echo "setup: installing kvstore${extras:+[$extras]} into .venv in three steps (log: $log)"
  echo "setup: upgrading pip in .venv"
  "$py" -m pip install -q --upgrade pip >>"$log" 2>&1 || echo "setup: (pip not upgraded; continuing)"
  step "1/3 torch 2.13.0, CPU build (about 200 MB, 900 MB unpacked; one to five minutes)" "$py" -m pip install -q torch==2.13.0
  # setup.py compiles the chunk-key loops in C and the hot eviction policies with mypyc (mypy comes with the build
  # requirements); a failed compile leaves that part pure Python and fails nothing.
  step "2/3 kvstore${extras:+[$extras]} and its dependencies (numba, fastapi, uvicorn...), compiling its C and mypyc parts (one to three minutes)" \
    "$py" -m pip install -q -e "$spec"
  echo "setup: 3/3 checking the install"
  "$py" -c "import kvstore.cli" >>"$log" 2>&1 || { tail -20 "$log"; echo "setup: kvstore does not import; see $log" >&2; exit 1; }
  touch "$stamp"
else
  echo "setup: .venv is up to date (${stamp#.venv/})"
fi
# Which implementations this install runs (a C compiler and mypyc at install time make the compiled ones).
"$py" -c "from kvstore.hashing import keys_implementation as k; from policies.eviction import policy_implementation as p
print(f'setup: chunk keys run as {k()}, the hot eviction policies as {p()} (pure Python where a compile failed)')"
echo "setup: ready. Put kvstore on your PATH with: source .venv/bin/activate"
