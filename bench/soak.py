"""Soak: a real daemon under continual eviction through both data planes; RSS, ledgers and errors per minute.

Two tenants, each a client in its own thread: "a" puts and gets over shared memory under a quota
(its own oldest chunks dropped all the time), "b" over HTTP, always new prompts, so the host and
NVMe tiers evict all the time (default: a 64 MiB host tier and a 2 GiB NVMe tier of 64 KiB chunks,
about 31,000 chunks held). Every 5 s the daemon's RSS is sampled; every minute one line gives the
RSS, the chunks indexed, each tenant's ledger (chunks, used_bytes), the daemon's memory by
component (/v1/stats `memory`), evictions, and the errors so far (puts not stored, client
exceptions, chunks read back with wrong bytes). After the run, the writers stop and each tenant's
`used_bytes` (its quota ledger) is compared with what the tiers hold for it (its keys that a batch
get still finds), and its memory budget's charge (segments, request buffers) with zero once its
client has closed.

    kvstore bench soak [--quick]                  30 minutes (--quick: 2)
    python -m bench.soak --minutes 60 --json soak.json    (records, the RSS samples, the minute lines)
    python -m bench.soak --minutes 60 --plot soak.png     (the RSS over the run: bench/soak_plot.py)

Records: the RSS slope over the last half of the run in MiB/min (baseline: 0.5 MiB/min, the limit;
ratio = the slope over it), the growth over that half, and per tenant used_bytes beside the bytes
held (ratio 1.0 = equal).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
SLOPE_LIMIT_MIB_PER_MIN = 0.5  # issue 43: RSS over the last half moves less than this


@dataclass
class Tally:
    """What the writers saw: keys written per tenant, batches not stored, exceptions, chunks read back wrong."""

    written: dict[str, list[bytes]] = field(default_factory=lambda: {"a": [], "b": []})
    not_stored: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    wrong_chunks: int = 0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _writer(url: str, name: str, use_shm: bool, stop: threading.Event, tally: Tally) -> None:
    from connector.client import KVStoreClient

    chunks = [torch.randn(LAYOUT.chunk_shape).to(LAYOUT.torch_dtype) for _ in range(BATCH)]
    outs = [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in range(BATCH)]
    written = tally.written[name]
    prompt = 0
    with KVStoreClient(url, token=TOKENS[name], use_shm=use_shm) as client:
        while not stop.is_set():
            try:
                base = (prompt * 2 + (name == "b")) * BATCH * LAYOUT.chunk_tokens  # disjoint prompts, ids < 2**31
                keys = client.chunk_keys(list(range(base, base + BATCH * LAYOUT.chunk_tokens)))
                result = client.put_many(keys, chunks)
                written.extend(keys)
                if result.not_stored:
                    tally.not_stored.append(next(iter(result.not_stored.values())))
                found = client.get_many(keys, outs)
                tally.wrong_chunks += sum(hit and not torch.equal(out, chunk) for hit, out, chunk in zip(found, outs, chunks))
                if prompt % 5 == 0 and len(written) > 4 * BATCH:  # re-read an older prompt: promotions too
                    client.get_many(written[-4 * BATCH:-3 * BATCH], outs)
            except Exception as exc:  # counted and shown; the soak goes on
                tally.exceptions.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
                time.sleep(1.0)
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


def _start(root: Path, host_mib: int, nvme_mib: int) -> Daemon:
    from service.process import Daemon, write_config

    quota = {"host": QUOTA_CHUNKS * LAYOUT.chunk_bytes, "nvme": 2 * QUOTA_CHUNKS * LAYOUT.chunk_bytes}
    tenants: list[dict[str, object]] = [{"name": "a", "token": TOKENS["a"], "salt": "soak-a", "shm": True, "quota": quota},
                                         {"name": "b", "token": TOKENS["b"], "salt": "soak-b"}]
    config = write_config(root, layout=LAYOUT, host_chunks=(host_mib << 20) // LAYOUT.chunk_bytes,
                          nvme_chunks=(nvme_mib << 20) // (LAYOUT.chunk_bytes + 8192), tenants=tenants,
                          service={"admin_token": ADMIN})
    return Daemon(config, root / "daemon.log").start(timeout_s=300)  # a loaded machine starts slowly


def _admin_stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60).json()


def _minute_line(minute: int, rss: float, stats: dict[str, Any], tally: Tally) -> str:
    tenants = stats["tenants"]
    ledgers = ", ".join(f"{n} {tenants[n]['chunks']} chunks / {tenants[n]['used_bytes'] / 2**20:.1f} MiB" for n in ("a", "b"))
    memory = stats.get("memory", {})
    parts = " ".join(f"{k.removesuffix('_bytes')} {v / 2**20:.1f}" for k, v in memory.items() if k != "rss_bytes")
    evictions = sum(t.get("evictions", 0) for t in stats["tiers"].values())
    return (f"min {minute:3d}: RSS {rss:7.1f} MiB | index {stats['chunks']} chunks | ledgers {ledgers} | "
            f"evictions {evictions} | not stored {len(tally.not_stored)}, exceptions {len(tally.exceptions)}, "
            f"wrong chunks {tally.wrong_chunks}" + (f" | memory MiB: {parts}" if parts else ""))


def _drive(url: str, pid: int, minutes: float) -> tuple[list[tuple[float, float]], Tally, list[str]]:
    """Both writers for `minutes`, the daemon's RSS sampled every 5 s and a line printed every minute."""
    stop = threading.Event()
    tally = Tally()
    threads = [threading.Thread(target=_writer, args=(url, n, n == "a", stop, tally), daemon=True) for n in ("a", "b")]
    samples: list[tuple[float, float]] = []
    lines: list[str] = []
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        while (elapsed := time.monotonic() - start) < minutes * 60:
            samples.append((elapsed, _rss_mib(pid)))
            if elapsed >= 60 * (len(lines) + 1):
                lines.append(_minute_line(len(lines) + 1, samples[-1][1], _admin_stats(url), tally))
                print(lines[-1], flush=True)
            time.sleep(5.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    return samples, tally, lines


def soak(minutes: float, root: Path, host_mib: int = 64, nvme_mib: int = 2048) -> tuple[list[Record], dict[str, object]]:
    daemon = _start(root, host_mib, nvme_mib)
    try:
        assert daemon.proc is not None
        print(f"min   0: RSS {_rss_mib(daemon.proc.pid):7.1f} MiB (daemon started)", flush=True)
        samples, tally, lines = _drive(daemon.url, daemon.proc.pid, minutes)
        checked = time.monotonic()
        admin = _admin_stats(daemon.url)
        held = {n: _held_bytes(daemon.url, n, tally.written[n], LAYOUT.chunk_bytes) for n in ("a", "b")}
        check_s = time.monotonic() - checked
    finally:
        daemon.close()
    last = [(t, m) for t, m in samples if t >= minutes * 60 / 2]
    growth = last[-1][1] - last[0][1] if last else float("nan")
    slope = _slope(last)
    records = [record("daemon RSS slope, last half of the run", slope, "MiB/min", "limit", SLOPE_LIMIT_MIB_PER_MIN),
               record("daemon RSS growth over the last half", growth, "MiB", "RSS at the half's start",
                      last[0][1] if last else float("nan"))]
    for n in ("a", "b"):
        used = admin["tenants"][n]["used_bytes"]
        records.append(record(f"tenant {n} used_bytes", used, "bytes", "bytes its keys hold in the tiers", held[n]))
    tenants = admin["tenants"]
    detail = {"minutes": minutes, "host_mib": host_mib, "nvme_mib": nvme_mib, "rss_mib": samples, "minute_lines": lines,
              "chunks_written": {n: len(w) for n, w in tally.written.items()},
              "rss_mib_first_last": [samples[0][1], samples[-1][1]] if samples else [],
              "rss_mib_last_half": [last[0][1], last[-1][1]] if last else [],
              "evictions": {t: admin["tiers"][t]["evictions"] for t in admin["tiers"]},
              "index_chunks": admin["chunks"], "ledger_chunks": {n: tenants[n]["chunks"] for n in ("a", "b")},
              "ledger_used_bytes": {n: tenants[n]["used_bytes"] for n in ("a", "b")}, "held_bytes": held,
              "memory_bytes_after_clients_closed": {n: tenants[n]["memory_bytes"] for n in ("a", "b")},
              "memory_by_component": admin.get("memory", {}), "service": admin["service"], "check_s": round(check_s, 1),
              "not_stored_examples": tally.not_stored[:3], "num_not_stored_batches": len(tally.not_stored),
              "exception_examples": tally.exceptions[:3], "num_exceptions": len(tally.exceptions),
              "wrong_chunks": tally.wrong_chunks}
    return records, detail


def run(quick: bool = False) -> list[Record]:
    """`kvstore bench soak`: 30 minutes (2 with --quick, on a 16 MiB host and 256 MiB NVMe tier)."""
    minutes = 2.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp:
        records, _ = soak(minutes, Path(tmp), *((16, 256) if quick else (64, 2048)))
    print_records(f"soak: {minutes:g} min, continual eviction through shm and HTTP", records)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--host-mib", type=int, default=64)
    parser.add_argument("--nvme-mib", type=int, default=2048)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="write the RSS over the run here (PNG)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp:
        records, detail = soak(args.minutes, Path(tmp), args.host_mib, args.nvme_mib)
    if args.plot:
        from bench.soak_plot import plot_rss

        plot_rss(detail["rss_mib"], records[0]["value"], SLOPE_LIMIT_MIB_PER_MIN, args.plot,  # type: ignore[arg-type]
                 f"soak: {args.minutes:g} min, host {args.host_mib} MiB, NVMe {args.nvme_mib} MiB")
    print_records(f"soak: {args.minutes:g} min, continual eviction through shm and HTTP", records)
    print(json.dumps({k: v for k, v in detail.items() if k not in ("rss_mib", "minute_lines")}, indent=1))
    if args.json:
        from bench.common import machine_info

        args.json.write_text(json.dumps({"suite": "soak", "machine": machine_info(), "records": records,
                                         "detail": detail}, indent=1))


if __name__ == "__main__":
    main()
