"""Soak: a real daemon under continual eviction through both data planes, for 30 minutes.

Two tenants, each a client in its own thread: "a" puts and gets over shared memory under a quota
(its own oldest chunks dropped all the time), "b" over HTTP, always new prompts, so the host and
NVMe tiers evict all the time. Every few seconds the daemon's RSS is sampled; after the run, the
writers stop and each tenant's `used_bytes` (its quota ledger) is compared with what the tiers
hold for it (its keys that a batch get still finds), and its memory budget's charge (segments,
request buffers) with zero once its client has closed.

    kvstore bench soak [--quick]                  30 minutes (--quick: 2)
    python -m bench.soak --minutes 30 --json docs/bench/soak.json    (records and the RSS samples)

Records: the RSS slope over the last third of the run in MiB/min (baseline: 0, the flat line;
ratio = the growth over that third relative to the RSS at its start), and per tenant used_bytes
beside the bytes held (ratio 1.0 = equal).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import torch

from bench.common import Record, print_records, record
from kvstore.layout import KVLayout

if TYPE_CHECKING:
    from service.process import Daemon

LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float16", chunk_tokens=16)  # 64 KiB chunks
TOKENS = {"a": "soak-token-aaaa-1", "b": "soak-token-bbbb-2"}
ADMIN = "soak-admin-token-0123456789"
BATCH = 8
QUOTA_CHUNKS = 64  # tenant a's quota: below what the tiers hold, so its own chunks are dropped all the time
CHECK_BATCH = 256


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
        for i in range(0, len(keys), CHECK_BATCH):
            reply = http.post("/v1/chunks/get", json={"keys": [k.hex() for k in keys[i:i + CHECK_BATCH]]})
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


def _start(root: Path) -> Daemon:
    from service.process import Daemon, write_config

    quota = {"host": QUOTA_CHUNKS * LAYOUT.chunk_bytes, "nvme": 2 * QUOTA_CHUNKS * LAYOUT.chunk_bytes}
    tenants: list[dict[str, object]] = [{"name": "a", "token": TOKENS["a"], "salt": "soak-a", "shm": True, "quota": quota},
                                         {"name": "b", "token": TOKENS["b"], "salt": "soak-b"}]
    config = write_config(root, layout=LAYOUT, host_chunks=96, nvme_chunks=256, tenants=tenants,
                          service={"admin_token": ADMIN})
    return Daemon(config, root / "daemon.log").start(timeout_s=300)  # a loaded machine starts slowly


def _drive(url: str, pid: int, minutes: float) -> tuple[list[tuple[float, float]], dict[str, list[bytes]], list[str]]:
    """Both writers for `minutes`, the daemon's RSS sampled every 5 s; returns (samples, keys written, failures)."""
    stop = threading.Event()
    written: dict[str, list[bytes]] = {"a": [], "b": []}
    errors: list[str] = []
    threads = [threading.Thread(target=_writer, args=(url, n, n == "a", stop, written[n], errors), daemon=True)
               for n in ("a", "b")]
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        while time.monotonic() - start < minutes * 60:
            samples.append((time.monotonic() - start, _rss_mib(pid)))
            time.sleep(5.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    return samples, written, errors


def soak(minutes: float, root: Path) -> tuple[list[Record], dict[str, object]]:
    daemon = _start(root)
    try:
        assert daemon.proc is not None
        samples, written, errors = _drive(daemon.url, daemon.proc.pid, minutes)
        checked = time.monotonic()
        admin = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60).json()
        held = {n: _held_bytes(daemon.url, n, written[n], LAYOUT.chunk_bytes) for n in ("a", "b")}
        check_s = time.monotonic() - checked
    finally:
        daemon.close()
    last = [(t, m) for t, m in samples if t >= minutes * 60 * 2 / 3]
    growth = last[-1][1] - last[0][1] if last else float("nan")
    records = [record("daemon RSS slope, last third of the run", _slope(last), "MiB/min", "flat (0 MiB/min)", 0.0,
                      ratio=growth / last[0][1] if last else float("nan"))]
    for n in ("a", "b"):
        used = admin["tenants"][n]["used_bytes"]
        records.append(record(f"tenant {n} used_bytes", used, "bytes", "bytes its keys hold in the tiers", held[n]))
    tenants = admin["tenants"]
    detail = {"minutes": minutes, "rss_mib": samples, "chunks_written": {n: len(w) for n, w in written.items()},
              "rss_mib_first_last": [samples[0][1], samples[-1][1]] if samples else [],
              "rss_mib_last_third": [last[0][1], last[-1][1]] if last else [],
              "evictions": {t: admin["tiers"][t]["evictions"] for t in admin["tiers"]},
              "index_chunks": admin["chunks"], "ledger_chunks": {n: tenants[n]["chunks"] for n in ("a", "b")},
              "memory_bytes_after_clients_closed": {n: tenants[n]["memory_bytes"] for n in ("a", "b")},
              "service": admin["service"], "check_s": round(check_s, 1),
              "not_stored_examples": errors[:3], "num_not_stored_batches": len(errors)}
    return records, detail


def run(quick: bool = False) -> list[Record]:
    """`kvstore bench soak`: 30 minutes (2 with --quick)."""
    minutes = 2.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp:
        records, _ = soak(minutes, Path(tmp))
    print_records(f"soak: {minutes:g} min, continual eviction through shm and HTTP", records)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp:
        records, detail = soak(args.minutes, Path(tmp))
    print_records(f"soak: {args.minutes:g} min, continual eviction through shm and HTTP", records)
    print(json.dumps({k: v for k, v in detail.items() if k != "rss_mib"}, indent=1))
    if args.json:
        from bench.common import machine_info

        args.json.write_text(json.dumps({"suite": "soak", "machine": machine_info(), "records": records,
                                         "detail": detail}, indent=1))


if __name__ == "__main__":
    main()
