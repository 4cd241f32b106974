"""kvstore: a tiered KV-cache store for LLM serving (GPU, host, NVMe, PFS, Redis)."""

from kvstore.errors import KVStoreError
from kvstore.layout import KVLayout

__all__ = ["KVLayout", "KVStoreError"]
__version__ = "0.1.0"
