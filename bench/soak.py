"""Soak: a real daemon under continual eviction through both data planes, for minutes.

Two tenants, each a client in its own thread: "a" puts and gets over shared memory, "b" over
HTTP, always new prompts, so the host and NVMe tiers evict all the time. Every few seconds the
daemon's RSS is sampled; after the run, the writers stop and each tenant's `used_bytes` (its
quota ledger) is compared with what the tiers hold for it (its keys that a batch get still
finds).

    .venv/bin/python -m bench.soak --minutes 10 --json soak.json

Records: the RSS slope after warm-up in MiB/min (baseline: 0, the flat line; ratio = the growth
over the post-warm-up window relative to the RSS at warm-up end), and per tenant used_bytes
beside the bytes held (ratio 1.0 = equal).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from bench.common import Record, print_records, record
from kvstore.layout import KVLayout

LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float16", chunk_tokens=16)  # 64 KiB chunks
TOKENS = {"a": "soak-token-aaaa-1", "b": "soak-token-bbbb-2"}
ADMIN = "soak-admin-token-0123456789"
BATCH = 8


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _writer(url: str, name: str, use_shm: bool, stop: threading.Event, written: list[bytes], errors: list[str]) -> None:
    from connector.client import KVStoreClient

    chunks = [torch.randn(LAYOUT.chunk_shape).to(LAYOUT.torch_dtype) for _ in range(BATCH)]
    outs = [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in range(BATCH)]
    prompt = 0
    with KVStoreClient(url, token=TOKENS[name], use_shm=use_shm) as client:
        while not stop.is_set():
            base = (prompt * 2 + (name == "b")) * BATCH * LAYOUT.chunk_tokens  # disjoint prompts, ids < 2**31
            keys = client.chunk_keys(list(range(base, base + BATCH * LAYOUT.chunk_tokens)))
            result = client.put_many(keys, chunks)
            written.extend(keys)
            if result.not_stored:
                errors.append(next(iter(result.not_stored.values())))
            client.get_many(keys, outs)
            if prompt % 5 == 0 and len(written) > 4 * BATCH:  # re-read an older prompt: promotions too
                old = written[-4 * BATCH:-3 * BATCH]
                client.get_many(old, outs)
            prompt += 1


def _held_bytes(url: str, name: str, keys: list[bytes], chunk_bytes: int) -> int:
    """Bytes of `keys` the daemon still holds for tenant `name` (a batch get's found flags)."""
    held = 0
    auth = {"Authorization": f"Bearer {TOKENS[name]}", "Accept": "application/octet-stream"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        for i in range(0, len(keys), 64):
            reply = http.post("/v1/chunks/get", json={"keys": [k.hex() for k in keys[i:i + 64]]})
            reply.raise_for_status()
            held += reply.headers["X-KV-Found"].count("1")
    return held * chunk_bytes


def _slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) in MiB/min."""
    n = len(samples)
    if n < 2:
        return float("nan")
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    return 60 * sum((t - mean_t) * (m - mean_m) for t, m in samples) / var if var else float("nan")


def soak(minutes: float, root: Path, warmup_fraction: float = 0.25) -> tuple[list[Record], dict[str, object]]:
    from service.process import Daemon, write_config

    tenants: list[dict[str, object]] = [{"name": "a", "token": TOKENS["a"], "salt": "soak-a", "shm": True},
                                        {"name": "b", "token": TOKENS["b"], "salt": "soak-b"}]
    config = write_config(root, layout=LAYOUT, host_chunks=96, nvme_chunks=256, tenants=tenants,
                          service={"admin_token": ADMIN})
    daemon = Daemon(config, root / "daemon.log").start()
    assert daemon.proc is not None
    stop = threading.Event()
    written: dict[str, list[bytes]] = {"a": [], "b": []}
    errors: list[str] = []
    threads = [threading.Thread(target=_writer, args=(daemon.url, n, n == "a", stop, written[n], errors), daemon=True)
               for n in ("a", "b")]
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        while time.monotonic() - start < minutes * 60:
            samples.append((time.monotonic() - start, _rss_mib(daemon.proc.pid)))
            time.sleep(5.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        admin = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        held = {n: _held_bytes(daemon.url, n, written[n], LAYOUT.chunk_bytes) for n in ("a", "b")}
    finally:
        stop.set()
        daemon.close()
    warm = [(t, m) for t, m in samples if t >= minutes * 60 * warmup_fraction]
    slope = _slope(warm)
    growth = warm[-1][1] - warm[0][1] if warm else float("nan")
    records = [record("daemon RSS slope after warm-up", slope, "MiB/min", "flat (0 MiB/min)", 0.0,
                      ratio=growth / warm[0][1] if warm else float("nan"))]
    for n in ("a", "b"):
        used = admin["tenants"][n]["used_bytes"]
        records.append(record(f"tenant {n} used_bytes", used, "bytes", "bytes its keys hold in the tiers", held[n]))
    detail = {"minutes": minutes, "rss_mib": samples, "chunks_written": {n: len(w) for n, w in written.items()},
              "evictions": {t: admin["tiers"][t]["evictions"] for t in admin["tiers"]},
              "index_chunks": admin["chunks"], "ledger_chunks": {n: admin["tenants"][n]["chunks"] for n in ("a", "b")},
              "not_stored_examples": errors[:3], "num_not_stored_batches": len(errors)}
    return records, detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp:
        records, detail = soak(args.minutes, Path(tmp))
    print_records(f"soak: {args.minutes:g} min, continual eviction through shm and HTTP", records)
    print(json.dumps({k: v for k, v in detail.items() if k != "rss_mib"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"records": records, "detail": detail}, indent=1))


if __name__ == "__main__":
    main()
