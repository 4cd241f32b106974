"""Paged attention: decode groups by context length (split of least cost), grouped results equal plain per-sequence
attention, and the gather workspace is reused across steps."""

from __future__ import annotations

import itertools
import math

import torch

from connector.engine.attention import (
    AttentionBatch,
    Workspace,
    decode_groups_for,
    length_groups,
    paged_attention,
    plan_decodes,
)

PAGE, KV_HEADS, REP, DIM = 4, 2, 2, 8


def _split_cost(lens: list[int], ends: list[int], page: int, group_cost: int) -> int:
    cost, lo = 0, 0
    for hi in ends:
        cost += (hi - lo) * (-(-lens[hi - 1] // page) * page) + group_cost
        lo = hi
    return cost


def _brute_force(lens: list[int], page: int, group_cost: int, max_groups: int) -> int:
    n, best = len(lens), math.inf
    for k in range(max_groups):
        for cuts in itertools.combinations(range(1, n), k):
            best = min(best, _split_cost(lens, [*cuts, n], page, group_cost))
    return best  # type: ignore[return-value]


def test_length_groups_finds_the_split_of_least_cost() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        lens = sorted(torch.randint(1, 1200, (n,), generator=gen).tolist())
        ends = length_groups(lens, PAGE, group_cost=256, max_groups=4)
        assert ends[-1] == n and ends == sorted(set(ends)) and len(ends) <= 4
        assert _split_cost(lens, ends, PAGE, 256) == _brute_force(lens, PAGE, 256, 4)


def test_length_groups_keeps_similar_lengths_together_and_splits_far_ones() -> None:
    assert length_groups([100] * 16, PAGE) == [16]
    assert length_groups([7], PAGE) == [1]
    assert length_groups([10, 12, 15, 900, 950, 1000], PAGE, group_cost=256) == [3, 6]
    assert length_groups([10, 20, 900], PAGE, group_cost=10_000) == [3]  # a group costs more than padding saves


def test_cuda_keeps_one_padded_batch_and_cpu_splits() -> None:
    assert decode_groups_for(torch.device("cuda")) == 1 and decode_groups_for(torch.device("cpu")) == 4


def _cache(num_blocks: int, seed: int) -> torch.Tensor:
    return torch.randn(2, num_blocks, PAGE, KV_HEADS, DIM, generator=torch.Generator().manual_seed(seed))


def _batch(lens: list[int], seq_lens: list[int], workspace: Workspace | None) -> AttentionBatch:
    """Sequence i owns pages [offset_i, offset_i + pages_i), laid out in reverse so tables are not the identity."""
    tables, first = [], 0
    for n in lens:
        pages = -(-n // PAGE)
        tables.append(list(range(first + pages - 1, first - 1, -1)))
        first += pages
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    positions = [p for n, fed in zip(lens, seq_lens, strict=True) for p in range(n - fed, n)]
    return AttentionBatch(positions=torch.tensor(positions), slot_ids=torch.zeros(len(positions), dtype=torch.long),
                          seq_lens=seq_lens, context_lens=lens, block_tables=block_tables, workspace=workspace)


def _reference(q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
    """Plain causal attention per sequence and query head, K/V read token by token from the pages."""
    out, row = torch.empty_like(q), 0
    for i, (n, ctx) in enumerate(zip(batch.seq_lens, batch.context_lens, strict=True)):
        table = batch.block_tables[i]
        keys = torch.stack([cache[0, table[t // PAGE], t % PAGE] for t in range(ctx)])  # [ctx, kv_heads, dim]
        values = torch.stack([cache[1, table[t // PAGE], t % PAGE] for t in range(ctx)])
        for j in range(n):
            visible = ctx - n + j + 1
            for h in range(q.shape[1]):
                scores = keys[:visible, h // REP] @ q[row + j, h] / math.sqrt(DIM)
                out[row + j, h] = torch.softmax(scores, 0) @ values[:visible, h // REP]
        row += n
    return out


def test_grouped_decodes_and_prefills_match_plain_attention() -> None:
    lens = [3, 700, 17, 650, 5, 33, 690, 9]  # decodes of very different lengths, plus a prefill of 5 tokens
    seq_lens = [1, 1, 1, 1, 5, 1, 1, 1]
    cache = _cache(sum(-(-n // PAGE) for n in lens), seed=1)
    q = torch.randn(sum(seq_lens), KV_HEADS * REP, DIM, generator=torch.Generator().manual_seed(2))
    batch = _batch(lens, seq_lens, Workspace(cache.dtype, cache.device))
    got = paged_attention(q, cache, batch, REP)
    assert batch.decode_groups is not None and len(batch.decode_groups) >= 2  # the split was exercised
    torch.testing.assert_close(got, _reference(q, cache, _batch(lens, seq_lens, None)), rtol=1e-5, atol=1e-5)
    # the plan is built once per step and reused by the next layer: same answer on the same batch
    torch.testing.assert_close(paged_attention(q, cache, batch, REP), got, rtol=0, atol=0)


def test_a_group_of_equal_lengths_needs_no_mask_and_groups_cover_every_decode() -> None:
    lens = [40, 40, 40, 1000]
    batch = _batch(lens, [1] * 4, None)
    groups = plan_decodes(batch, [0, 1, 2, 3], starts=[0, 1, 2, 3, 4], page=PAGE, device=torch.device("cpu"))
    assert [g.num_seqs for g in groups] == [3, 1]
    assert all(g.mask is None for g in groups)
    assert sorted(torch.cat([g.rows for g in groups]).tolist()) == [0, 1, 2, 3]


def test_workspace_is_reused_across_steps_and_grows_only_when_needed() -> None:
    workspace = Workspace(torch.float32, torch.device("cpu"))
    lens = [60, 64, 70]
    cache = _cache(64, seed=3)
    q = torch.randn(3, KV_HEADS * REP, DIM)
    paged_attention(q, cache, _batch(lens, [1, 1, 1], workspace), REP)
    size, pointer = workspace.nbytes, workspace.buffer.data_ptr()
    assert size > 0
    for _ in range(3):
        paged_attention(q, cache, _batch(lens, [1, 1, 1], workspace), REP)
    assert (workspace.nbytes, workspace.buffer.data_ptr()) == (size, pointer)
    longer = [200, 210, 220]
    paged_attention(torch.randn(3, KV_HEADS * REP, DIM), _cache(256, seed=4), _batch(longer, [1, 1, 1], workspace), REP)
    assert workspace.nbytes > size
