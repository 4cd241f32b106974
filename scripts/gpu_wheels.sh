#!/usr/bin/env bash
# Here, before a device run: fetch the wheels the H200 image lacks (its python3 is 3.12 with torch,
# cupy, xxhash, msgpack, typer, rich, httpx, hypothesis, transformers; no network there) into .whl/,
# at the versions this venv uses. Then `run` scripts/gpu_check.sh with carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pins=$(.venv/bin/pip freeze 2>/dev/null | grep -i -E '^(lz4|fastapi|starlette|pydantic|pydantic[-_]core|annotated-types|annotated-doc|typing-inspection|uvicorn|httptools|platformdirs|aiofiles|pyyaml)==' || true)
[ -n "$pins" ] || { echo "no pins: run bash scripts/setup.sh test first" >&2; exit 1; }
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl $pins
ls -la .whl
