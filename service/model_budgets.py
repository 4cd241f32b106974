"""`ModelBudgets`: optional byte budgets per model, on a daemon that serves several (service.model_budgets).

    [service]
    model_budgets = { "meta-llama/Llama-3.1-8B" = "40GiB", "Qwen/Qwen3-0.6B" = "4GiB" }

A model is the name its client sends (X-KV-Model, the name it registered its layout under). Every model's chunks
share the tiers and one eviction order; a budget caps what one model holds in them: a put that would pass it first
removes that model's own least recently stored chunks (as a tenant's quota does, service/byte_ledger.py), so a
busy model cannot take the node's memory and disks from a quiet one. A model without a budget keeps what eviction
leaves it. Charged from the puts since the daemon started: chunks recovered at start count for no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvstore.hashing import ChunkKey
from kvstore.store import TieredStore
from service.byte_ledger import ByteLedger


class ModelBudgets:
    """A ByteLedger per budgeted model, kept equal to what the store holds (drops heard as they happen)."""

    def __init__(self, store: TieredStore, budgets: Mapping[str, int]) -> None:
        self._store = store
        self._ledgers = {name: ByteLedger(f"model {name!r}", limit) for name, limit in budgets.items()}
        if self._ledgers:
            store.add_drop_listener(self.on_dropped)

    def charge(self, model: str, store_keys: list[ChunkKey], chunk_bytes: int) -> list[ChunkKey]:
        """Charge a put of `model` before it runs; its own chunks to remove for room (none without a budget).

        Raises:
            QuotaError: the put alone is larger than the model's budget.
        """
        ledger = self._ledgers.get(model)
        return [] if ledger is None else ledger.charge(store_keys, chunk_bytes)

    def settle(self, model: str, store_keys: Iterable[ChunkKey], chunk_bytes: int) -> None:
        ledger = self._ledgers.get(model)
        if ledger is not None:
            ledger.settle(store_keys, chunk_bytes, self._store.holds)

    def on_dropped(self, key: ChunkKey) -> None:
        for ledger in self._ledgers.values():
            if ledger.owns(key):
                ledger.settle([key], 0, self._store.holds)

    def used_bytes(self) -> dict[str, int]:
        """Each budgeted model's bytes held now."""
        return {name: ledger.used_bytes for name, ledger in self._ledgers.items()}
