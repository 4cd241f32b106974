"""A backend that stalls: Redis (a tier and the cluster index) paused with SIGSTOP for 10 s under a
real daemon, while a client keeps putting and looking up and a poller times /healthz.

    .venv/bin/python -m bench.stall [--pause-s 10] [--json stall.json]

Records: the slowest put beside put_timeout_s + 0.5 s (ratio < 1: the deadline holds), the slowest
lookup, and /healthz p99 / max beside the 100 ms target. Needs redis-server on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import torch

from bench.common import Record, print_records, record
from bench.hostile import HEALTHZ_TARGET_MS, HealthPoller
from kvstore.layout import KVLayout

PUT_TIMEOUT_S = 2.0
TOKEN = "stall-token-aaaa"


def _redis(root: Path, port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    for _ in range(500):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


def stall(pause_s: float, root: Path) -> tuple[list[Record], dict[str, object]]:
    from connector.client import KVStoreClient
    from service.process import Daemon, free_port, write_config

    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", chunk_tokens=16)
    port = free_port()
    proc = _redis(root, port)
    url = f"redis://127.0.0.1:{port}/0"
    config = write_config(root, layout=layout, host_chunks=64, tenants=[{"name": "a", "token": TOKEN, "salt": "s"}])
    text = config.read_text().replace("put_timeout_s = 3.0", f"put_timeout_s = {PUT_TIMEOUT_S}")
    config.write_text(text + f'[[tiers]]\nkind = "redis"\ncapacity = "{256 * layout.chunk_bytes}B"\n'
                      f'options = {{ url = "{url}", prefix = "stall" }}\n')
    os.environ.update(KVSTORE_CLUSTER_URL=url, KVSTORE_CLUSTER_NODE_ID="stall")
    daemon = Daemon(config, root / "daemon.log").start()
    poller = HealthPoller(daemon.url)
    puts: list[float] = []
    lookups: list[float] = []
    try:
        with KVStoreClient(daemon.url, token=TOKEN, use_shm=False, timeout_s=60) as client:
            poller.start()
            os.kill(proc.pid, signal.SIGSTOP)
            end, i = time.monotonic() + pause_s, 0
            while time.monotonic() < end:
                tokens = list(range(i * 64, i * 64 + 4 * layout.chunk_tokens))
                keys = client.chunk_keys(tokens)
                t0 = time.perf_counter()
                client.put_many(keys, [torch.randn(layout.chunk_shape) for _ in keys])
                puts.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                client.lookup(list(range((i + 1000) * 64, (i + 1000) * 64 + 64)))  # a miss: would ask Redis
                lookups.append(time.perf_counter() - t0)
                i += 1
            os.kill(proc.pid, signal.SIGCONT)
    finally:
        poller.stop()
        daemon.close()
        proc.kill()
        proc.wait()
    lat = sorted(poller.samples)
    records = [record("slowest put, Redis paused", max(puts), "s", "put_timeout_s + 0.5 s", PUT_TIMEOUT_S + 0.5),
               record("slowest lookup, Redis paused", max(lookups), "s", "put_timeout_s + 0.5 s", PUT_TIMEOUT_S + 0.5),
               record("/healthz p99, Redis paused", lat[int(0.99 * (len(lat) - 1))], "ms", "100 ms target",
                      HEALTHZ_TARGET_MS),
               record("/healthz max, Redis paused", lat[-1], "ms", "100 ms target", HEALTHZ_TARGET_MS)]
    return records, {"puts": len(puts), "lookups": len(lookups), "healthz_samples": len(lat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause-s", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstore-stall-") as tmp:
        records, detail = stall(args.pause_s, Path(tmp))
    print_records(f"Redis paused {args.pause_s:g} s under a daemon", records)
    print(json.dumps(detail))
    if args.json:
        args.json.write_text(json.dumps({"records": records, "detail": detail}, indent=1))


if __name__ == "__main__":
    main()
