"""The store demo: save a long prompt's KV, drop the host copies, reload from disk, time each step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from kvstore.cli.checked_config import load_checked_config
from kvstore.config import StoreConfig
from kvstore.store import TieredStore
from kvstore.types import TierKind
from kvstore.units import format_bytes


def run_store_demo(config_path: Path | None, prompt_tokens: int) -> None:
    console = Console()
    config, caps = load_checked_config(config_path, command="store-demo")
    layout = config.layout
    console.print(f"[bold]kvstore demo[/]: model {config.model_id}, {layout.bytes_per_token:,} B of KV per token, "
                  f"chunks of {layout.chunk_tokens} tokens = {format_bytes(layout.chunk_bytes)}")
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # a new prompt each run
    tokens = torch.randint(0, 128_000, (prompt_tokens,), generator=generator, dtype=torch.int32)
    rows: list[tuple[str, str, str]] = []
    with TieredStore(config, caps=caps) as store:
        recovered = store.stats().get("recovered_chunks", 0)
        rows.append(("open store", f"index rebuilt from disk: {recovered} chunks", ""))
        keys = store.chunk_keys(tokens)
        chunks = [torch.randn(layout.chunk_shape, generator=generator).to(layout.torch_dtype) for _ in keys]
        nbytes = len(keys) * layout.chunk_bytes
        rows.append(("prompt", f"{prompt_tokens:,} tokens -> {len(keys)} full chunks", format_bytes(nbytes)))

        start = time.perf_counter()
        result = store.put_many(keys, chunks)
        put_s = time.perf_counter() - start
        rows.append(("put into host", f"{len(result.stored)} stored, {len(result.not_stored)} not", _rate(nbytes, put_s)))

        start = time.perf_counter()
        store.flush()
        rows.append(("write-through to disk", "background writers drained", _rate(nbytes, put_s + time.perf_counter() - start)))

        start = time.perf_counter()
        cached = store.lookup(tokens)
        rows.append(("lookup", f"{cached:,} of {prompt_tokens:,} tokens cached", f"{(time.perf_counter() - start) * 1e3:.3f} ms"))

        outs = [store.empty_chunk().zero_() for _ in keys]  # load buffers an engine would reuse
        start = time.perf_counter()
        store.get_many(keys, outs)
        rows.append(("get from host", "all chunks", _rate(nbytes, time.perf_counter() - start)))

        if any(lv.kind is not TierKind.HOST for lv in store.levels):
            dropped = store.drop_tier_copies(TierKind.HOST)
            rows.append(("drop host copies", f"{dropped} chunks dropped", ""))
            for out in outs:
                out.zero_()
            start = time.perf_counter()
            ok = store.get_many(keys, outs)
            rows.append(("reload from disk", f"{sum(ok)} of {len(keys)} chunks", _rate(nbytes, time.perf_counter() - start)))
        identical = all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
        rows.append(("bytes identical", str(identical), ""))
        stats = store.stats()

    table = Table(title="what the store did")
    for column in ("step", "result", "size / speed"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print({name: {k: v for k, v in tier.items() if k in ("used_bytes", "chunks", "hits", "puts", "evictions")}
                   for name, tier in stats["tiers"].items()})
    _say_where_data_stays(console, config, stats)


def _say_where_data_stays(console: Console, config: StoreConfig, stats: dict) -> None:
    """The disk tiers keep the chunks (the next run finds them): say where, how much, how to remove."""
    for tier in config.tiers:
        if tier.path and tier.kind in (TierKind.NVME, TierKind.PFS):
            used = stats["tiers"].get(tier.kind.value, {}).get("used_bytes", 0)
            console.print(f"data left in {tier.path} ({format_bytes(used)}, kept for the next run; "
                          f"the {tier.kind.value} tier may grow to {format_bytes(tier.capacity_bytes)}); "
                          f"remove it with: rm -rf {tier.path}")


def _rate(nbytes: int, seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms, {nbytes / seconds / 1e9:.2f} GB/s"
