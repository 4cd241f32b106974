"""Sidecar daemon: chunk get through shared memory and HTTP beside the in-process store, and lookup
latency at a target request rate from concurrent loopback clients.

    in-process:  TieredStore.get_many            (memcpy out of the host arena)
    shm:         KVStoreClient.get_many into outs from its empty_chunk() (1 small HTTP call; the daemon
                                                   copies straight into those buffers, which live in the
                                                   client's own memfd pool segment: one copy)
    shm_copy:    the same with ordinary torch.empty outs (the daemon copies into the client's staging
                                                   segment, the client copies out of it: two copies)
    http:        KVStoreClient.get_many, no shm   (chunk bytes as the body over loopback TCP, recv_into place)
    socket:      a raw loopback TCP socket moving the same bytes (sendall of one buffer -> recv_into the outs)

Control calls (an 8-key lookup, the call an engine makes per request) through the client's
hand-written HTTP/1.1 (connector/lean_http.py) and through httpx on the same daemon, interleaved:
wall time and client CPU per call, as ratios lean / httpx.

Targets: shared-memory get >= 0.7 x in-process (issue 5); HTTP get >= 0.5 x the raw socket (issue 17);
lookup P99 under 2 ms at 500 requests/s.
"""

from __future__ import annotations

import queue
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import torch

from bench.common import Record, best_time, gbps, print_records, record
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

LOOKUP_TARGET_RPS = 500
LOOKUP_TARGET_P99_MS = 2.0
SHM_TARGET_RATIO = 0.7
HTTP_TARGET_RATIO = 0.5


class _SocketPeer:
    """The baseline: a loopback TCP server thread that answers each 1-byte request with `payload`."""

    def __init__(self, payload: memoryview) -> None:
        import socket
        import threading

        self.payload = payload
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.client = socket.create_connection(self.listener.getsockname())
        self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while conn.recv(1):
                conn.sendall(self.payload)

    def get_many(self, keys: object, outs: list[torch.Tensor]) -> None:
        self.client.sendall(b"g")
        for out in outs:
            view, filled = out.view(torch.uint8).reshape(-1).numpy().data, 0
            while filled < view.nbytes:
                filled += self.client.recv_into(view[filled:])

    def close(self) -> None:
        self.client.close()
        self.thread.join(timeout=5)
        self.listener.close()


def _layout(quick: bool) -> KVLayout:
    # Llama-3-8B geometry (128 KiB of KV per token); 2 MiB chunks in quick mode, 8 MiB otherwise.
    return KVLayout.from_preset("llama-3-8b", chunk_tokens=16 if quick else 64)


def _get_rates(quick: bool, root: Path) -> list[Record]:
    from connector.client import KVStoreClient
    from service.process import Daemon, write_config

    layout = _layout(quick)
    num_chunks = 16
    repeats = 7 if quick else 21
    daemon = Daemon(write_config(root / "daemon", layout=layout, host_chunks=2 * num_chunks + 4, nvme_chunks=0),
                    root / "daemon.log")
    config = StoreConfig(layout=layout, model_id="svc-test",
                         tiers=(TierConfig(kind=TierKind.HOST, capacity_bytes=(2 * num_chunks + 4) * layout.chunk_bytes),))
    chunks = [torch.randn(layout.chunk_shape).to(layout.torch_dtype) for _ in range(num_chunks)]
    outs = [torch.empty(layout.chunk_shape, dtype=layout.torch_dtype) for _ in range(num_chunks)]
    nbytes = num_chunks * layout.chunk_bytes
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # every path copies with one thread (the client and daemon do)
    daemon.start()
    try:
        with TieredStore(config) as store, KVStoreClient(daemon.url, use_shm=True) as shm, \
                KVStoreClient(daemon.url, use_shm=False) as http:
            keys = store.chunk_keys(list(range(num_chunks * layout.chunk_tokens)))
            assert store.put_many(keys, chunks).ok and shm.put_many(keys, chunks).ok
            peer = _SocketPeer(torch.cat([c.reshape(-1).view(torch.uint8) for c in chunks]).numpy().data)
            paths: dict[str, Callable[..., object]] = {
                "local": store.get_many, "shm": shm.get_many, "shm_copy": shm.get_many, "http": http.get_many,
                "socket": peer.get_many}
            pooled = [shm.empty_chunk() for _ in range(num_chunks)]
            pool = shm._segments.pool if shm._segments is not None else None
            assert pool is not None and all(pool.slot_of(o.view(torch.uint8).reshape(-1)) is not None for o in pooled)
            # Interleaved rounds: on a shared machine each ratio compares runs under the same load.
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(repeats):
                for name, target in paths.items():
                    samples[name].append(best_time(partial(target, keys, pooled if name == "shm" else outs),
                                                   repeats=1, warmup=1))
            peer.close()
            assert torch.equal(outs[-1], chunks[-1]) and torch.equal(pooled[-1], chunks[-1])
    finally:
        torch.set_num_threads(threads)
        daemon.stop()
    local_s, shm_s, copy_s, http_s, socket_s = (
        statistics.median(samples[name]) for name in ("local", "shm", "shm_copy", "http", "socket"))
    local, raw_socket = gbps(nbytes, local_s), gbps(nbytes, socket_s)
    baseline = f"in-process get ({num_chunks} x {layout.chunk_bytes >> 20} MiB)"
    return [record("service.inprocess.get", local, "GB/s", "in-process get", local, 1.0),
            record("service.shm.get", gbps(nbytes, shm_s), "GB/s", baseline, local),
            record("service.shm_copy.get", gbps(nbytes, copy_s), "GB/s", baseline, local),
            record("service.socket.get", raw_socket, "GB/s", "raw loopback TCP socket, same bytes", raw_socket),
            record("service.http.get", gbps(nbytes, http_s), "GB/s", "raw loopback TCP socket, same bytes",
                   raw_socket),
            record("service.http.get_vs_inprocess", gbps(nbytes, http_s), "GB/s", baseline, local)]


def _control_calls(quick: bool, root: Path) -> list[Record]:
    """An 8-key msgpack lookup through LeanHTTP and through an httpx.Client (both keep-alive, same
    bytes, same daemon), interleaved rounds: median wall time and client CPU per call."""
    import httpx

    from connector.lean_http import LeanHTTP
    from kvstore import wire_types
    from kvstore.wire_types import MSGPACK, LookupRequest
    from service.process import Daemon, write_config

    layout = KVLayout.from_preset("llama-3-8b", chunk_tokens=16)
    (root / "control").mkdir(exist_ok=True)
    daemon = Daemon(write_config(root / "control", layout=layout, host_chunks=4, nvme_chunks=0), root / "control.log")
    body = wire_types.encode(LookupRequest(keys=[bytes([i]) * 16 for i in range(8)]))
    headers = {"Accept": MSGPACK, "Content-Type": MSGPACK}
    calls, rounds = (200, 5) if quick else (1000, 9)
    daemon.start()
    try:
        lean = LeanHTTP(daemon.url, {"Accept": MSGPACK}, 10.0)
        with httpx.Client(base_url=daemon.url, headers=headers, timeout=10.0) as client:
            clients = {"lean": lambda: lean.request("POST", "/v1/lookup", body, MSGPACK),
                       "httpx": lambda: client.post("/v1/lookup", content=body)}
            wall: dict[str, list[float]] = {name: [] for name in clients}
            cpu: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(rounds):
                for name, call in clients.items():
                    call()  # warm: connection open
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(calls):
                        call()
                    wall[name].append((time.perf_counter() - t0) / calls)
                    cpu[name].append((time.process_time() - c0) / calls)
        lean.close()
    finally:
        daemon.stop()
    lean_us, httpx_us = (statistics.median(wall[n]) * 1e6 for n in ("lean", "httpx"))
    lean_cpu, httpx_cpu = (statistics.median(cpu[n]) * 1e6 for n in ("lean", "httpx"))
    return [record("service.control.lean_call", lean_us, "us", "httpx.Client, same call", httpx_us),
            record("service.control.httpx_call", httpx_us, "us", "httpx.Client, same call", httpx_us),
            record("service.control.lean_client_cpu", lean_cpu, "us", "httpx.Client CPU, same call", httpx_cpu),
            record("service.control.httpx_client_cpu", httpx_cpu, "us", "httpx.Client CPU, same call", httpx_cpu)]


def _lookup_client(url: str, prompt: list[int], expected: int, period_s: float, duration_s: float, seed: int,
                   start_line: Barrier, out: Queue[list[float]]) -> None:
    """One engine-like client process: open-loop lookups, Poisson arrivals at 1 / period_s per second
    (independent clients never fall into lock-step), latencies sent back through `out`. All clients
    wait at `start_line` after their warm-up, so every measured second has all of them running and
    none of them starting up (importing torch) or exiting."""
    import random

    from connector.client import KVStoreClient

    rng = random.Random(seed)
    with KVStoreClient(url, use_shm=False) as client:
        for _ in range(20):
            client.lookup(prompt)  # warm-up: connection, caches
        start_line.wait(timeout=120)
        mine: list[float] = []
        start = next_at = time.perf_counter()
        while next_at - start < duration_s:
            time.sleep(max(0.0, next_at - time.perf_counter()))
            t0 = time.perf_counter()
            if client.lookup(prompt) != expected:
                raise RuntimeError("lookup returned a wrong count")
            mine.append(time.perf_counter() - t0)
            next_at += rng.expovariate(1.0 / period_s)
    out.put(mine)


def _lookup_latency(quick: bool, root: Path) -> list[Record]:
    """Lookup latency from concurrent loopback clients, each its own process (as engines are: client
    threads in one process would mostly measure the client's GIL, not the daemon)."""
    import multiprocessing

    from connector.client import KVStoreClient
    from service.process import Daemon, write_config

    layout = KVLayout.from_preset("llama-3-8b", chunk_tokens=256)
    daemon = Daemon(write_config(root / "lookup", layout=layout, host_chunks=24, nvme_chunks=0), root / "lookup.log")
    daemon.start()
    num_clients, duration_s = 4, 3.0 if quick else 10.0
    prompt = list(range(8 * layout.chunk_tokens))  # an 8-chunk prompt, 4 chunks cached
    latencies: list[float] = []
    context = multiprocessing.get_context("spawn")
    try:
        with KVStoreClient(daemon.url, use_shm=False) as setup:
            keys = setup.chunk_keys(prompt)
            zeros = torch.zeros(layout.chunk_shape, dtype=layout.torch_dtype)
            setup.put_many(keys[:4], [zeros] * 4)
        out = context.Queue()
        args = (daemon.url, prompt, 4 * layout.chunk_tokens, num_clients / LOOKUP_TARGET_RPS, duration_s)
        start_line = context.Barrier(num_clients)
        clients = [context.Process(target=_lookup_client, args=(*args, seed, start_line, out))
                   for seed in range(num_clients)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 120 + duration_s
        for _ in clients:
            while True:
                try:
                    latencies.extend(out.get(timeout=1.0))
                    break
                except queue.Empty:
                    if any(c.exitcode not in (None, 0) for c in clients) or time.monotonic() > deadline:
                        raise RuntimeError("a lookup client died or hung; see its traceback above") from None
        for client in clients:
            client.join()
        wall = duration_s
    finally:
        daemon.stop()
    q = statistics.quantiles(latencies, n=100)
    rps = len(latencies) / wall
    return [record("service.lookup.p50", q[49] * 1e3, "ms", "target p99", LOOKUP_TARGET_P99_MS),
            record("service.lookup.p99", q[98] * 1e3, "ms", "target p99", LOOKUP_TARGET_P99_MS),
            record("service.lookup.rps", rps, "req/s", "target rate", LOOKUP_TARGET_RPS)]


def run(quick: bool) -> list[Record]:
    """Records service.shm.get / service.http.get (ratio to in-process get) and service.lookup.p99 (ms)."""
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-service-") as tmp:
        root = Path(tmp)
        (root / "daemon").mkdir()
        (root / "lookup").mkdir()
        records = _get_rates(quick, root) + _control_calls(quick, root) + _lookup_latency(quick, root)
    print_records(f"kvstore service ({'quick' if quick else 'full'}); targets: shm get >= {SHM_TARGET_RATIO} x "
                  f"in-process, http get >= {HTTP_TARGET_RATIO} x raw socket, lookup p99 < {LOOKUP_TARGET_P99_MS} ms at {LOOKUP_TARGET_RPS} req/s", records)
    return records
