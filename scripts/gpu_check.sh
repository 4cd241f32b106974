#!/usr/bin/env bash
# On the GPU machine, in one run (about 5 minutes): the gpu-marked tests (CUDA kernels against the
# torch reference, codecs on CUDA tensors, the engine on CUDA against transformers, kvikio when
# present) and `kvstore bench engine --quick` on CUDA. Everything lands in $OUT.
# Here first: bash scripts/gpu_wheels.sh; then the device tool's run with carry [".whl"] and
# command "bash scripts/gpu_check.sh", timeout_s 540.
set -u
OUT=${OUT:-/tmp/kvstore-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi -L; python3 - <<'PY'
import importlib
for name in ("torch", "cupy", "kvikio", "xxhash", "msgpack", "lz4", "fastapi", "uvicorn", "transformers"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # a missing optional package is a finding, not a stop
        print(name, "MISSING:", exc)
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
} 2>&1 | tee "$OUT/env.txt"
timeout 240 python3 -m pytest -p no:cacheprovider -o addopts="" -m gpu -q -rs \
    tests/gpu_kernels tests/policies/test_codecs.py tests/connector/test_engine_vs_transformers.py \
    tests/tiers/test_nvme_tier.py 2>&1 | tee "$OUT/gpu_tests.log"
timeout 240 python3 -c "from kvstore.cli import app; app()" bench engine --quick --json "$OUT/engine_gpu.json" 2>&1 \
    | tee "$OUT/engine_gpu.log"
