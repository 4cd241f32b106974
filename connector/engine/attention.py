"""Paged attention in torch: each prefill over its own pages; decodes batched in groups of similar context length,
planned once per step (`plan_decodes`) and reused by every layer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# A decode group's fixed cost (its page gather, mask and attention calls, per layer) in attended tokens. On this
# 2-core CPU, one thread, bench/engine.py's model (2 kv heads x 64): a group's calls cost about 35 us, an
# attended token 0.1 us (K/V in cache) to 0.3 us (from DRAM). A rough exchange rate, not tuned.
GROUP_COST_TOKENS = 256
MAX_DECODE_GROUPS = 4  # on CPU; on CUDA one padded batch (see `decode_groups_for`)


def decode_groups_for(device: torch.device) -> int:
    """How many decode groups a step may use. On a GPU the padded tokens' reads are cheap beside the kernel
    launches of more groups (a GPU was not lent to measure the exchange rate), so CUDA keeps one batch."""
    return 1 if device.type == "cuda" else MAX_DECODE_GROUPS


@dataclass(slots=True)
class AttentionBatch:
    """Where each fed token sits. Tokens are flattened over sequences in batch order.

    positions: [T] position of each token; slot_ids: [T] flat cache slot (block * page + offset);
    seq_lens: tokens fed per sequence; context_lens: KV length per sequence after this step;
    block_tables: [B, max_pages] page ids per sequence (padded with 0).
    """

    positions: torch.Tensor
    slot_ids: torch.Tensor
    seq_lens: list[int]
    context_lens: list[int]
    block_tables: torch.Tensor
    decode_groups: list[DecodeGroup] | None = field(default=None, repr=False)  # planned by the first layer, reused
    workspace: Workspace | None = field(default=None, repr=False)  # the runner's gather buffer, reused every step
    rope: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)  # RoPE cos/sin, built once per step


class Workspace:
    """One reusable buffer for gathered K/V pages, grown (doubling) to the largest gather seen, so at most
    twice one layer's K/V of the largest step: bounded by max_num_seqs x the longest context.

    A fresh multi-MiB tensor per layer costs page faults on CPU (glibc hands big blocks back to the
    kernel): gathering 32 sequences x 1024 tokens took 21 ms into new memory, 3.5 ms into this buffer.
    Each gather is consumed before the next, so one buffer serves them all.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.buffer = torch.empty(0, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def take(self, *shape: int) -> torch.Tensor:
        n = math.prod(shape)
        if n > self.buffer.numel():
            self.buffer = torch.empty(max(n, 2 * self.buffer.numel()), dtype=self.buffer.dtype, device=self.buffer.device)
        return self.buffer[:n].view(shape)


def gather_pages(kv_cache: torch.Tensor, pages: torch.Tensor, workspace: Workspace | None) -> torch.Tensor:
    """K and V of `pages` of one layer's cache [2, blocks, page, kv_heads, dim] -> [2, len(pages) * page, kv_heads, dim]."""
    flat = kv_cache.flatten(2)  # [2, blocks, page * kv_heads * dim]; index_select beats advanced indexing ~5x
    if workspace is None:
        out = flat.index_select(1, pages)
    else:
        out = torch.index_select(flat, 1, pages, out=workspace.take(2, pages.numel(), flat.shape[2]))
    return out.view(2, -1, *kv_cache.shape[3:])


@dataclass(slots=True)
class DecodeGroup:
    """Decoding sequences attended as one padded batch: their query rows, pages and padding mask."""

    rows: torch.Tensor  # [B] flat token index of each sequence's single new token
    pages: torch.Tensor  # [B * num_pages] page ids, row-major
    num_seqs: int
    max_len: int
    mask: torch.Tensor | None  # [B, 1, 1, max_len], None when every context is max_len long


def length_groups(lens: list[int], page: int, group_cost: int = GROUP_COST_TOKENS,
                  max_groups: int = MAX_DECODE_GROUPS) -> list[int]:
    """Split ascending context lengths into at most `max_groups` runs; returns each run's end index.

    A run is padded to its longest member (rounded up to a page), so it costs len(run) x longest +
    `group_cost`; dynamic programming picks the split of least total cost. Continuous batching mixes
    short and long sequences, and one padded batch would attend over the longest context for all.
    """
    n = len(lens)
    if n <= 1 or max_groups <= 1:
        return [n]
    padded = torch.tensor([-(-x // page) * page for x in lens], dtype=torch.float64)
    start = torch.arange(n)[:, None]  # the run starts at `start` ...
    end = torch.arange(1, n + 1)[None, :]  # ... and ends before `end`
    run = ((end - start) * padded[None, :] + group_cost).masked_fill(start >= end, math.inf)
    best = torch.full((n + 1,), math.inf, dtype=torch.float64)
    best[0] = 0.0
    cuts, totals = [], []
    for _ in range(max_groups):
        value, cut = (best[:n, None] + run).min(0)  # best split of lengths [0, end) ending in one more run
        best = torch.cat([torch.tensor([math.inf], dtype=torch.float64), value])
        cuts.append(cut.tolist())
        totals.append(float(best[n]))
    groups = min(range(max_groups), key=totals.__getitem__) + 1
    ends, j = [], n
    for g in range(groups - 1, -1, -1):
        ends.append(j)
        j = cuts[g][j - 1]
    return ends[::-1]


def plan_decodes(batch: AttentionBatch, decode_ids: list[int], starts: list[int], page: int,
                 device: torch.device) -> list[DecodeGroup]:
    order = sorted(decode_ids, key=lambda i: batch.context_lens[i])
    lens = [batch.context_lens[i] for i in order]
    groups, lo = [], 0
    for hi in length_groups(lens, page, max_groups=decode_groups_for(device)):
        ids, group_lens = order[lo:hi], lens[lo:hi]
        max_len = group_lens[-1]
        tables = batch.block_tables[ids][:, : -(-max_len // page)]
        mask = None
        if group_lens[0] != max_len:
            as_tensor = torch.tensor(group_lens, device=device)
            mask = (torch.arange(max_len, device=device)[None, :] < as_tensor[:, None])[:, None, None, :]
        rows = torch.tensor([starts[i] for i in ids], device=device)
        groups.append(DecodeGroup(rows=rows, pages=tables.reshape(-1), num_seqs=len(ids), max_len=max_len, mask=mask))
        lo = hi
    return groups


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, batch: AttentionBatch, num_rep: int) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged KV; q [T, heads, dim] -> [T, heads, dim].

    GQA without copying K/V per query head: the `num_rep` query heads that share a kv head
    (query head h uses kv head h // num_rep, as in Llama's repeat_kv) are folded into the query
    length. Each prefill runs on its own; single-token (decode) sequences run as padded batches of
    similar context length (`plan_decodes`).
    """
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    starts = [0]
    for n in batch.seq_lens:
        starts.append(starts[-1] + n)
    kv_heads, dim = kv_cache.shape[-2], kv_cache.shape[-1]
    decode_ids = []
    for i, n in enumerate(batch.seq_lens):
        if n == 1:
            decode_ids.append(i)
            continue
        ctx = batch.context_lens[i]
        kv = gather_pages(kv_cache, batch.block_tables[i][: -(-ctx // kv_cache.shape[2])], batch.workspace)[:, :ctx]
        k, v = kv[0], kv[1]  # [ctx, kv_heads, dim]
        qi = q[starts[i] : starts[i] + n].view(n, kv_heads, num_rep, dim).permute(1, 2, 0, 3).reshape(kv_heads, num_rep * n, dim)
        dev = q.device
        mask = torch.arange(ctx, device=dev)[None, :] <= torch.arange(ctx - n, ctx, device=dev)[:, None]
        o = F.scaled_dot_product_attention(qi, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask.repeat(num_rep, 1), scale=scale)
        out[starts[i] : starts[i] + n] = o.view(kv_heads, num_rep, n, dim).permute(2, 0, 1, 3).reshape(n, -1, dim)
    if decode_ids:
        if batch.decode_groups is None:
            batch.decode_groups = plan_decodes(batch, decode_ids, starts, kv_cache.shape[2], q.device)
        for group in batch.decode_groups:
            out.index_copy_(0, group.rows, _decode_group(q, kv_cache, group, num_rep, scale, batch.workspace))
    return out


def _decode_group(q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup, num_rep: int, scale: float,
                  workspace: Workspace | None) -> torch.Tensor:
    kv_heads, dim = kv_cache.shape[-2], kv_cache.shape[-1]
    kv = gather_pages(kv_cache, group.pages, workspace).view(2, group.num_seqs, -1, kv_heads, dim)[:, :, : group.max_len]
    k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [B, kv_heads, max_len, dim]
    qd = q.index_select(0, group.rows).view(group.num_seqs, kv_heads, num_rep, dim)
    o = F.scaled_dot_product_attention(qd, k, v, attn_mask=group.mask, scale=scale)
    return o.reshape(group.num_seqs, -1, dim)
