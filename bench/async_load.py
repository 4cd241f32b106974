"""`kvstore bench async_load`: do loads from kvstore hold up the requests that are decoding?

Real `vllm serve` processes (bench.vllm_server, vLLM's default process layout, its own prefix cache off so
every reuse is a load from kvstore) beside a `kvstore serve` daemon, driven over the OpenAI API with
streamed completions (bench.async_load_rounds). A long prefix is computed and stored once; then each
server runs quiet rounds (background requests decoding alone) and load rounds (the same, and a request
for the long prefix arriving while they decode), interleaved. One invocation, one server for each way the connector loads:
load pacing (`async_load = "auto"`: connector.vllm.load_pacing sends a load to a loader thread unless running
it in the step costs the others less than the steps its request would wait), asynchronous loads (`async_load =
true`, the default: the load runs on a loader thread while the other requests keep decoding) and synchronous
ones (`async_load = false`: the load runs before the step's forward pass). Three servers.
Every figure is the load rounds' over the quiet rounds' of the same server (goal: TPOT within 1.2x), and
the long request's TTFT beside computing the same prefix. Model: bench.serving_model (dummy weights).
Needs the integration environment (scripts/integration_env.sh).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.async_load_rounds import Round, run_round, tpot_s, window_gaps_s
from bench.common import Record, print_records, record
from bench.serving_model import MODEL, kv_bytes_per_token, write_model
from bench.vllm_server import ServeSpec, VLLMServer
from connector.client import KVStoreClient
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

BLOCK, CHUNK = 32, 256
MODES: dict[str, bool | str] = {"auto": "auto", "async": True, "sync": False}
DAEMON_START_S, SERVER_START_S = 300, 900


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    long_tokens: int  # the stored prefix (whole chunks)
    num_background: int
    background_tokens: int  # each background prompt: under one chunk, so nothing of it is loaded
    answer_tokens: int  # each background request decodes this many
    num_rounds: int  # of each kind, per server


FULL = Sizes(long_tokens=31 * CHUNK, num_background=4, background_tokens=200, answer_tokens=32, num_rounds=3)
QUICK = Sizes(long_tokens=15 * CHUNK, num_background=3, background_tokens=200, answer_tokens=24, num_rounds=2)


def run(quick: bool = False) -> list[Record]:
    sizes = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix="kvbench-async-load-"))
    try:
        return _measure(work, sizes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def _measure(work: Path, sizes: Sizes) -> list[Record]:
    model_dir = write_model(work / "model")
    layout = KVLayout(num_layers=MODEL["num_hidden_layers"], num_kv_heads=MODEL["num_key_value_heads"],
                      head_dim=MODEL["head_dim"], dtype="float32", chunk_tokens=CHUNK)
    num_chunks = 4 * sizes.long_tokens // CHUNK + 16
    (work / "daemon").mkdir()
    config = write_config(work / "daemon", layout=layout, host_chunks=num_chunks, nvme_chunks=num_chunks)
    daemon = Daemon(config, work / "daemon" / "daemon.log")
    long_prefix = _tokens(random.Random(7), sizes.long_tokens)
    results: dict[str, dict[str, float]] = {}
    try:
        daemon.start(timeout_s=DAEMON_START_S)
        for mode, async_load in MODES.items():
            results[mode] = _serve(model_dir, daemon, sizes, long_prefix, async_load, work / mode)
    finally:
        daemon.close()
    records = _records(results, sizes)
    print_records(_title(sizes), records)
    return records


def _spec(model_dir: Path, daemon: Daemon, sizes: Sizes, async_load: bool | str) -> ServeSpec:
    pool_tokens = 2 * (sizes.long_tokens + 64 + sizes.num_background * (sizes.background_tokens + sizes.answer_tokens))
    return ServeSpec(model_dir=model_dir, block_size=BLOCK, prefix_caching=False,
                     connector={"url": daemon.url, "chunk_tokens": CHUNK, "async_load": async_load},
                     kv_cache_bytes=pool_tokens * kv_bytes_per_token(), max_model_len=sizes.long_tokens + 256)


def _serve(model_dir: Path, daemon: Daemon, sizes: Sizes, long_prefix: list[int], async_load: bool | str,
           work: Path) -> dict[str, float]:
    """One fresh server: the prefix stored (if not yet), a warm-up, then quiet and load rounds interleaved."""
    rng = random.Random(11)
    with VLLMServer(_spec(model_dir, daemon, sizes, async_load), work / "vllm.log").start(SERVER_START_S) as server:
        figures = {"compute_ttft": _store_prefix(server, daemon, long_prefix)}
        backgrounds = lambda: [_tokens(rng, sizes.background_tokens) for _ in range(sizes.num_background)]  # noqa: E731
        run_round(server.url, backgrounds(), sizes.answer_tokens, None, 0)  # warm-up
        quiet: list[Round] = []
        loaded: list[Round] = []
        for _ in range(sizes.num_rounds):
            quiet.append(run_round(server.url, backgrounds(), sizes.answer_tokens, None, 0))
            loaded.append(run_round(server.url, backgrounds(), sizes.answer_tokens,
                                    long_prefix + _tokens(rng, 40), after_tokens=2))
    return {**figures, **_figures(quiet, loaded)}


def _store_prefix(server: VLLMServer, daemon: Daemon, long_prefix: list[int]) -> float:
    """Compute and store the long prefix unless the daemon holds it; the TTFT of computing it (nan if held)."""
    with KVStoreClient(daemon.url) as client:
        if client.stats()["chunks"] >= len(long_prefix) // CHUNK:
            return float("nan")
        ttft = server.complete(long_prefix, 1).ttft_s
        deadline = time.monotonic() + 300
        while client.stats()["chunks"] < len(long_prefix) // CHUNK:  # the connector stores in the background
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon holds {client.stats()['chunks']} of {len(long_prefix) // CHUNK} chunks")
            time.sleep(0.2)
    return ttft


def _figures(quiet: list[Round], loaded: list[Round]) -> dict[str, float]:
    """Means over the rounds; a quiet round's window gaps over its paired load round's window."""
    quiet_gaps = [window_gaps_s(q, r.window) for q, r in zip(quiet, loaded, strict=True) if r.window is not None]
    load_gaps = [window_gaps_s(r, r.window) for r in loaded if r.window is not None]
    loads = [r.load for r in loaded if r.load is not None]
    return {"tpot_quiet": statistics.fmean(tpot_s(q) for q in quiet),
            "tpot_load": statistics.fmean(tpot_s(r) for r in loaded),
            "gap_quiet": statistics.fmean(g for gaps in quiet_gaps for g in gaps),
            "gap_load": statistics.fmean(g for gaps in load_gaps for g in gaps),
            "gap_max_quiet": statistics.fmean(max(gaps) for gaps in quiet_gaps),
            "gap_max_load": statistics.fmean(max(gaps) for gaps in load_gaps),
            "load_ttft": statistics.fmean(c.ttft_s for c in loads),
            "load_hit_tokens": statistics.fmean(c.num_cached_tokens for c in loads)}


def _records(results: dict[str, dict[str, float]], sizes: Sizes) -> list[Record]:
    records = []
    for mode, f in results.items():
        same = f"{mode}: the same server's rounds without the load"
        records += [record(f"async_load.{mode}.others_tpot", f["tpot_load"], "s", same + " (goal <= 1.2x)",
                           f["tpot_quiet"]),
                    record(f"async_load.{mode}.others_gap_in_load_window", f["gap_load"], "s", same, f["gap_quiet"]),
                    record(f"async_load.{mode}.others_max_gap_in_load_window", f["gap_max_load"], "s", same,
                           f["gap_max_quiet"]),
                    record(f"async_load.{mode}.load_hit_tokens", f["load_hit_tokens"], "tokens",
                           "the prefix's whole chunks", sizes.long_tokens)]
    computed = next(f["compute_ttft"] for f in results.values() if f["compute_ttft"] == f["compute_ttft"])
    for mode, f in results.items():
        records.append(record(f"async_load.{mode}.long_request_ttft", f["load_ttft"], "s",
                              "computing the same prefix (first server)", computed))
    for figure in ("tpot_load", "gap_load", "gap_max_load", "load_ttft"):
        records.append(record(f"async_load.async_vs_sync.{figure}", results["async"][figure], "s", "sync loads",
                              results["sync"][figure]))
    return records


def _title(sizes: Sizes) -> str:
    return (f"kvstore bench async_load: {sizes.num_background} requests decoding {sizes.answer_tokens} tokens "
            f"while one loads a {sizes.long_tokens}-token prefix ({sizes.long_tokens // CHUNK} chunks of {CHUNK}) "
            f"from kvstore's host tier; {sizes.num_rounds} rounds of each kind per server; vllm serve, CPU")
