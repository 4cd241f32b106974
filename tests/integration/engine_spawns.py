"""What vLLM's engine core and worker processes start with on CPU, for the spawn server that forks them.

vLLM's CPU platform (vllm/platforms/cpu.py, `check_and_update_config`) sets these in the API server's environment
before it spawns the engine core, which spawns the worker: the processes start under them (LD_PRELOAD loads
PyTorch's libgomp first, and libtcmalloc where the wheel bundles it). The spawn server imports under the same
values, so that a child forked from it is the process a spawn would start; a request under other load-time
values is started by the trampoline as a fresh interpreter (tests/helpers/spawn_server.py).
"""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path

# What the engine core and the worker import (the API server's module too: spawn's children run it as __mp_main__).
SPAWN_PRELOAD = ("vllm.entrypoints.launchers.api_server.entry", "vllm.v1.engine.core",
                 "vllm.v1.executor.multiproc_executor", "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
                 "vllm.model_executor.models.llama", "uvloop")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{name} is not importable here; run the integration suite in scripts/integration_env.sh's "
                           f"environment")
    return Path(spec.origin).parent


def ld_preload(current: str) -> str:
    """LD_PRELOAD as vLLM's CPU platform extends it: PyTorch's libgomp after, libtcmalloc before (in glob's order,
    the first match, as it takes them)."""
    torch_dir = _package_dir("torch")
    if not any(name in current for name in ("libomp", "libgomp", "libiomp")):
        gomps = [*glob.glob(str(torch_dir.parent / "torch.libs" / "libgomp*.so*")),
                 *glob.glob(str(torch_dir / "lib" / "libgomp*.so*"))]
        if gomps:
            current = f"{current}:{gomps[0]}" if current else gomps[0]
    if "libtcmalloc" not in current:
        libs = _package_dir("vllm") / "libs"
        found = [*glob.glob(str(libs / "libtcmalloc_minimal*.so*")), *glob.glob(str(libs / "libtcmalloc.so*"))]
        if found:
            current = f"{found[0]}:{current}" if current else found[0]
    return current


def spawned_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` (an API server's) as vLLM's CPU platform passes it to the processes it spawns (one worker)."""
    return {**env, "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "NUMEXPR_MAX_THREADS": str(len(os.sched_getaffinity(0))),
            "TORCHINDUCTOR_COMPILE_THREADS": "1", "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1",
            "TORCHINDUCTOR_CPP_DYNAMIC_THREADS": "1", "LD_PRELOAD": ld_preload(env.get("LD_PRELOAD", "")),
            "LOCAL_WORLD_SIZE": "1"}
