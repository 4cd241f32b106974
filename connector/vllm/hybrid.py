"""The vLLM connector's per-KV-cache-group path (vLLM's hybrid manager on): lookups across groups, per-group transfers.

The planner (connector.vllm.plan) plans on the model-scoped key chain and on the block table of the first
full-attention group; this module turns each of its specs into one spec per group, in that group's keys
(connector.vllm.window.group_keys), blocks and registered layout, and moves them with one PagedTransfer
per group. No vllm import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from connector.vllm.plan import TransferSpec
from connector.vllm.window import (
    NULL_BLOCK_ID,
    GroupKind,
    GroupShape,
    boundary_blocks,
    group_keys,
    served_boundary,
)
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout

Tables = tuple[tuple[int, ...], ...]  # a request's block ids, one table per KV cache group, as vLLM hands them


@dataclass(frozen=True, slots=True)
class Group:
    """One KV cache group: its shape, its index in vLLM's config and the layout its chunks are stored in."""

    shape: GroupShape
    index: int
    layout: KVLayout

    def keys(self, keys: Sequence[bytes]) -> list[bytes]:
        return group_keys(keys, self.shape, self.index, self.layout)

    def model_name(self, model: str, chunk_tokens: int) -> str:
        """The name this group's layout is registered under with the daemon, which keeps one chunk geometry per
        name (layer counts aside): the model's own, or the model's with the group's kind and piece size."""
        if self.layout.chunk_tokens == chunk_tokens and self.shape.kind is not GroupKind.STATE:
            return model
        return f"{model}|{self.shape.kind.value}-{self.layout.chunk_tokens}t"


def planning_group(groups: Sequence[Group]) -> int:
    """The group whose block table the planner sees: the first full-attention one (it holds every token)."""
    for group in groups:
        if group.shape.kind is GroupKind.FULL:
            return group.index
    raise ConfigError("kvstore's vLLM connector needs at least one full-attention layer in a hybrid model; "
                      "run this model without --kv-transfer-config")


def hybrid_lookup(groups: Sequence[Group], lookups: Sequence[Callable[[Sequence[bytes]], int]],
                  chunk_tokens: int) -> Callable[[Sequence[bytes]], int]:
    """The planner's lookup: how many leading chunks every group can serve (connector.vllm.window)."""

    def lookup(keys: Sequence[bytes]) -> int:
        held: dict[tuple[int, int], bool] = {}
        full = {g.index: lookups[g.index](g.keys(keys)) for g in groups if g.shape.kind is GroupKind.FULL}

        def present(index: int, end: int) -> bool:
            chunk = end // chunk_tokens - 1
            if index in full:
                return chunk < full[index]
            if (index, chunk) not in held:
                held[index, chunk] = lookups[index](groups[index].keys(keys[chunk:chunk + 1])) == 1
            return held[index, chunk]

        shapes = [g.shape for g in groups]
        return served_boundary(shapes, chunk_tokens, len(keys) * chunk_tokens, present) // chunk_tokens

    return lookup


def group_specs(group: Group, spec: TransferSpec, table: Sequence[int], chunk_tokens: int, *,
                load: bool) -> list[TransferSpec]:
    """The spec's whole chunks as this group moves them: its own keys and blocks; nothing whose blocks vLLM
    freed (a null block). A load of a per-boundary group fills only the piece at the load's end."""
    shape = group.shape
    ends = [(spec.first_chunk + i + 1) * chunk_tokens for i in range(len(spec.keys))]
    keys = group.keys(spec.keys)
    if not shape.per_boundary(chunk_tokens):
        first = _first_live_block(table, spec.start_token // shape.block_size) * shape.block_size
        start = max(spec.start_token, first)
        skip = start // chunk_tokens - spec.first_chunk
        if start >= spec.end_token or len(table) * shape.block_size < spec.end_token:
            return []
        return [replace(spec, keys=tuple(keys[skip:]), first_chunk=spec.first_chunk + skip, start_token=start,
                        block_ids=tuple(table))]
    out = []
    for key, end in zip(keys, ends, strict=True):
        if end > spec.end_token or (load and end != spec.end_token):
            continue
        blocks = boundary_blocks(shape, end)
        ids = tuple(table[b] for b in blocks) if blocks.stop <= len(table) else ()
        if ids and NULL_BLOCK_ID not in ids:
            out.append(replace(spec, keys=(key,), first_chunk=0, start_token=0, end_token=len(ids) * shape.block_size,
                               block_ids=ids))
    return out


def _first_live_block(table: Sequence[int], start: int) -> int:
    """The first block at or after `start` that vLLM still holds (a window's freed blocks are null)."""
    for i in range(start, len(table)):
        if table[i] != NULL_BLOCK_ID:
            return i
    return len(table)


class GroupTransfer(Protocol):
    """What moves one group's pieces: connector.vllm.transfer.PagedTransfer (attention blocks) or
    connector.vllm.state.StateTransfer (state pages)."""

    def load(self, spec: TransferSpec) -> set[int]: ...

    def save(self, specs: Sequence[TransferSpec]) -> None: ...

    def take_counters(self) -> dict[str, float]: ...

    def wait(self) -> None: ...


class HybridTransfer:
    """The worker side for several KV cache groups: one transfer per group, each on its own store."""

    def __init__(self, groups: Sequence[Group], transfers: Sequence[GroupTransfer], chunk_tokens: int) -> None:
        self.groups, self.transfers, self.chunk_tokens = list(groups), list(transfers), chunk_tokens

    def load(self, spec: TransferSpec, tables: Tables) -> set[int]:
        """Fill every group's blocks for the spec; the ids of the blocks that could not be loaded."""
        failed: set[int] = set()
        for group, transfer in zip(self.groups, self.transfers, strict=True):
            for part in group_specs(group, spec, tables[group.index], self.chunk_tokens, load=True):
                failed |= transfer.load(part)
        return failed

    def save(self, specs: Sequence[TransferSpec], tables: dict[str, Tables]) -> None:
        for group, transfer in zip(self.groups, self.transfers, strict=True):
            transfer.save([part for spec in specs if spec.req_id in tables
                           for part in group_specs(group, spec, tables[spec.req_id][group.index],
                                                   self.chunk_tokens, load=False)])

    def take_counters(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for transfer in self.transfers:
            for name, value in transfer.take_counters().items():
                total[name] = total.get(name, 0) + value
        return total

    def wait(self) -> None:
        for transfer in self.transfers:
            transfer.wait()

