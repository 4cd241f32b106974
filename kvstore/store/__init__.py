"""The store: `TieredStore` and its parts (index, levels, mover, reads, recovery, host plane)."""

from kvstore.store.tiered_store import TieredStore
from kvstore.types import PutResult

__all__ = ["PutResult", "TieredStore"]
