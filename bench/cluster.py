"""`kvstore bench cluster`: Redis tier get/put of 32 MiB chunks beside raw redis-py GET/SET of the same bytes,
and the cluster index's update rate beside raw pipelined HSET/HDEL of the same fields, all in one run.

Uses $KVSTORE_BENCH_REDIS_URL, else starts a private redis-server (no persistence) on a free port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator

import redis
import torch
import xxhash
from redis.typing import EncodableT, FieldT

from bench.common import Record, gbps, print_records, record
from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.index import ClusterIndex, field_of
from kvstore.layout import KVLayout
from kvstore.types import ChunkMeta, StoreEvent, TierKind
from tiers.redis_tier import RedisTier

LAYOUT = KVLayout.from_preset("llama-3-8b")  # 256-token chunks of 32 MiB


def run(quick: bool = False) -> list[Record]:
    num_chunks = 3 if quick else 8
    num_events = 20_000 if quick else 200_000
    with redis_url() as url:
        records = _chunks(url, num_chunks, repeats=3 if quick else 5)
        records += _index_rate(url, num_events)
    print_records(f"cluster: Redis tier ({LAYOUT.chunk_bytes >> 20} MiB chunks) and cluster index", records)
    return records


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    if os.environ.get("KVSTORE_BENCH_REDIS_URL"):
        yield os.environ["KVSTORE_BENCH_REDIS_URL"]
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench cluster needs redis-server (apt-get install redis-server) or KVSTORE_BENCH_REDIS_URL")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="kvbench-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _chunks(url: str, num_chunks: int, repeats: int) -> list[Record]:
    nbytes = LAYOUT.chunk_bytes
    payloads = [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
                for i in range(num_chunks)]
    raw_values = [p.numpy().tobytes() for p in payloads]
    keys = [xxhash.xxh3_128_digest(f"bench-{i}".encode()) for i in range(num_chunks)]
    meta = ChunkMeta(codec_id=0, raw_bytes=nbytes, stored_bytes=nbytes, layout_fingerprint=LAYOUT.fingerprint)
    client = redis.Redis.from_url(url)
    tier = RedisTier(capacity_bytes=4 * num_chunks * nbytes, url=url, prefix="bench")
    out = torch.empty(nbytes, dtype=torch.uint8)
    total = num_chunks * nbytes
    try:  # raw and tier calls alternate, so noise from other processes hits both alike
        raw_put, tier_put = _alternating(lambda: [client.set(f"raw:{i}", v) for i, v in enumerate(raw_values)],
                                         lambda: _each(tier.put, zip(keys, payloads, [meta] * num_chunks, strict=True)),
                                         repeats)
        raw_get, tier_get = _alternating(lambda: [len(client.get(f"raw:{i}") or b"") for i in range(num_chunks)],
                                         lambda: [tier.get_into(k, out) for k in keys], repeats)
        assert tier.get_into(keys[-1], out) == nbytes and torch.equal(out, payloads[-1])
    finally:
        client.delete(*[f"raw:{i}" for i in range(num_chunks)])
        for key in keys:
            tier.remove(key)
        tier.close()
    return [
        record("cluster.redis.put", gbps(total, tier_put), "GB/s", "redis-py SET same bytes", gbps(total, raw_put)),
        record("cluster.redis.get", gbps(total, tier_get), "GB/s", "redis-py GET same bytes", gbps(total, raw_get)),
    ]


def _each(fn: Callable[..., object], calls: Iterable[tuple[object, ...]]) -> None:
    for args in calls:
        fn(*args)


def _alternating(raw: Callable[[], object], ours: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of `raw` and of `ours`, called in turns after one warm-up each."""
    times: tuple[list[float], list[float]] = ([], [])
    for step in range(repeats + 1):
        for samples, fn in zip(times, (raw, ours), strict=True):
            start = time.perf_counter()
            fn()
            if step:
                samples.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _index_rate(url: str, num_events: int) -> list[Record]:
    """Store events -> index writes per second, beside raw pipelined HSET/HDEL of the same fields and batches."""
    config = ClusterConfig(url=url, cluster_name="bench", node_id="bench-node", max_queued_events=num_events,
                           flush_interval_s=0.001)
    events = [StoreEvent("stored" if i % 4 else "removed", xxhash.xxh3_128_digest(i.to_bytes(8, "little")),
                         TierKind.HOST if i % 2 else TierKind.NVME) for i in range(num_events)]
    index = ClusterIndex(config).start()
    index.flush()  # the initial (empty) resync
    start = time.perf_counter()
    for event in events:
        index.on_event(event)
    index.flush(timeout_s=600)
    index_s = time.perf_counter() - start
    index.close()
    client = redis.Redis.from_url(url)
    start = time.perf_counter()
    for begin in range(0, num_events, config.batch_size):
        pipe = client.pipeline(transaction=False)
        batch = events[begin:begin + config.batch_size]
        stored: dict[FieldT, EncodableT] = {field_of(e.key, e.tier): 1 for e in batch if e.kind == "stored"}
        pipe.hset("raw:idx", mapping=stored)
        pipe.hdel("raw:idx", *[field_of(e.key, e.tier) for e in batch if e.kind != "stored"])
        pipe.execute()
    raw_s = time.perf_counter() - start
    client.delete("raw:idx")
    return [record("cluster.index.update", num_events / index_s, "events/s", "raw pipelined HSET/HDEL",
                   num_events / raw_s)]
