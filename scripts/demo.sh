#!/usr/bin/env bash
# The main job on the embedded default (host RAM + NVMe under ~/.cache/kvstore; no GPU, no Redis).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvstore demo "$@"
