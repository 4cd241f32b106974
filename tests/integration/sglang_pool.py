"""SGLang's own CPU host pool and storage-backend factory, set up as HiCache does (shared by test_sglang.py and
the second process it starts: `python -m tests.integration.sglang_pool URL LAYOUT PAGES OUT [SALT]`)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

import torch

LAYERS, HEADS, DIM, PAGE, POOL_TOKENS = 2, 2, 32, 64, 1024
KV_LORA_RANK, ROPE_DIM = 512, 64  # an MLA pool's latent (SGLang's MLA pools are built for DeepSeek's)


class _Unavailable(types.ModuleType):
    """An inert stand-in: any attribute is another stand-in; calling one raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is not available: torchvision is not installed (CPU torch)")


def torchvision_placeholder() -> None:
    """SGLang 0.5.23's configs package imports torchvision at module level for its vision-language models;
    PyPI's torchvision wheels are CUDA builds that cannot load against CPU torch (scripts/integration_env.sh
    removes them). The text-only storage layer never calls it, so register an inert placeholder."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                 "torchvision.transforms.v2", "torchvision.transforms.v2.functional", "torchvision.io"):
        module = _Unavailable(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__version__ = "0+unavailable"  # type: ignore[attr-defined]
        sys.modules.setdefault(name, module)


def make_host_pool(layout: str) -> Any:
    """A device pool on "cpu" and SGLang's MHATokenToKVPoolHost over it (as its HiCache controller builds them)."""
    torchvision_placeholder()
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    device_pool = MHATokenToKVPool(POOL_TOKENS, PAGE, torch.float32, HEADS, DIM, LAYERS, "cpu", False,
                                   start_layer=0, end_layer=LAYERS)
    capacity = device_pool.size if device_pool.host_capacity_tokens is None else device_pool.host_capacity_tokens
    return MHATokenToKVPoolHost(device_pool.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=capacity,
                                start_layer=device_pool.start_layer, end_layer=device_pool.end_layer,
                                write_back_staging=device_pool.hicache_write_back_staging)


def make_mla_host_pool(layout: str, dtype: torch.dtype = torch.bfloat16) -> Any:
    """SGLang's MLA device pool on "cpu" (kv_lora_rank 512 + rope 64, DeepSeek's) and its MLATokenToKVPoolHost, as
    SGLang's pool assembler builds them (hybrid_pool_assembler._build_mha_mla_host_pool). The host pool is booked in
    SGLang's own budget scope (as its auto-sizing does): outside one, SGLang keeps 10 GiB of the machine's free memory
    in reserve, and on a shared test machine even this 5 MB pool is refused."""
    torchvision_placeholder()
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    device_pool = MLATokenToKVPool(POOL_TOKENS, PAGE, dtype, KV_LORA_RANK, ROPE_DIM, LAYERS, "cpu", False,
                                   start_layer=0, end_layer=LAYERS)
    capacity = device_pool.size if device_pool.host_capacity_tokens is None else device_pool.host_capacity_tokens
    with host_memory_budget_scope(64 << 20):
        return _mla_host_pool(device_pool, layout, capacity)


def _mla_host_pool(device_pool: Any, layout: str, capacity: int) -> Any:
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    return MLATokenToKVPoolHost(device_pool.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=capacity,
                                start_layer=device_pool.start_layer, end_layer=device_pool.end_layer,
                                target_layer_num=device_pool.layer_num, override_kv_cache_dim=device_pool.kv_cache_dim)


def make_backend(url: str, host_pool: Any, *, mla: bool = False, tp_rank: int = 0, tp_size: int = 1,
                 dcp_size: int = 1) -> Any:
    """The backend as `--hicache-storage-backend dynamic` creates and registers it (`mla`: as SGLang's cache
    controller configures it for an MLA device pool, is_mla_model)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    extra = {"backend_name": "kvstore", "module_path": "connector.sglang.hicache",
             "class_name": "KVStoreHiCacheStorage", "interface_v1": 1, "url": url}
    config = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                  dcp_size=dcp_size, dcp_rank=tp_rank % dcp_size,
                                  logical_page_size=PAGE * dcp_size if dcp_size > 1 else None,
                                  is_page_first_layout=host_pool.layout != "layer_first",
                                  model_name="tiny-deepseek" if mla else "tiny-llama",
                                  extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", config, host_pool)
    backend.register_mem_pool_host(host_pool)
    return backend


def page_keys(n: int, salt: str = "p") -> list[str]:
    return [f"{salt}{i:04d}" for i in range(n)]


def main(url: str, layout: str, num_pages: int, out: str, salt: str = "p") -> None:
    """Second process: a fresh host pool reads the pages (keys `page_keys(num_pages, salt)`) into slots after the
    first process's."""
    pool = make_host_pool(layout)
    backend = make_backend(url, pool)
    keys = page_keys(num_pages, salt)
    indices = torch.arange(num_pages * PAGE, 2 * num_pages * PAGE)
    result = {"exists": backend.batch_exists(keys), "got": backend.batch_get_v1(keys, indices),
              "pages": [pool.get_data_page(int(i), flat=False).clone() for i in indices[::PAGE]]}
    torch.save(result, out)
    backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:6])
