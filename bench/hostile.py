"""Hostile load on a real daemon: schemathesis over every route (the schema itself loaded with the token),
then hand-written bodies (nested, truncated, oversized, slow, abandoned), the docs routes with no, wrong
and right Basic credentials, and slow-header sockets, while a poller times /healthz.

    .venv/bin/python -m bench.hostile [--examples 50] [--json hostile.json]

Records: 5xx answers (baseline 0), requests sent, and /healthz latency p50 / p99 / max beside the
100 ms target (ratio = latency / target; < 1 meets it). Tests assert only "no 5xx" and "healthz
answered" (tests/service/test_bad_input.py, test_hostile_bodies.py); the latencies are measured here.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import socket
import statistics
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import httpx

from bench.common import Record, machine_info, print_records, record, require_extra
from kvstore.layout import KVLayout

TOKEN = "hostile-token-aaaa"
HEALTHZ_TARGET_MS = 100.0
STRUCTURED = ["/v1/lookup", "/v1/chunks/put", "/v1/chunks/get", "/v1/chunks/delete", "/v1/shm/segments",
              "/v1/shm/segments/put", "/v1/shm/segments/get", "/v1/shm/segments/close"]


def _poll(url: str, stop: EventType, out: Queue[list[float]]) -> None:
    host, port = url.removeprefix("http://").split(":")
    samples = []
    while not stop.is_set():
        start = time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)  # a new connection, as a prober's
        try:
            conn.request("GET", "/healthz")
            ok = conn.getresponse().status == 200
        except OSError:
            ok = False
        finally:
            conn.close()
        samples.append((time.perf_counter() - start) * 1e3 if ok else float("inf"))
        time.sleep(0.02)
    out.put(samples)


class HealthPoller:
    """GET /healthz every 20 ms on a fresh connection each time, from its own process (so the load
    generator's GIL never delays it); latencies in ms (inf when it fails)."""

    def __init__(self, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=_poll, args=(url, self._stop, self._out), daemon=True)
        self.samples: list[float] = []

    def start(self) -> None:
        self._proc.start()

    def stop(self) -> None:
        self._stop.set()
        self.samples = self._out.get(timeout=60)
        self._proc.join(timeout=30)


def _fuzz(url: str, examples: int, statuses: list[int]) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.core.result import Err

    auth = {"Authorization": f"Bearer {TOKEN}"}
    api = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth)  # the schema needs a token too
    for result in api.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operation = result.ok()
        for mode in map(GenerationMode, ("positive", "negative")):  # StrEnum: not iterable to mypy under 3.10

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case) -> None:
                statuses.append(case.call(headers=auth).status_code)

            try:
                check()
            except Unsatisfiable:
                pass


def _sock(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _hand_written(url: str, statuses: list[int]) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bodies = [("application/json", b"[" * 200_000 + b"]" * 200_000), ("application/json", b'{"keys": ["ab'),
              ("application/msgpack", b"\x91" * 200_000), ("application/json", b"[[[[[]]]]]"),
              ("application/json", b'{"keys": ' + b'"' + b"a" * (20 << 20) + b'"}')]
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        for path in STRUCTURED:
            for content_type, body in bodies:
                statuses.append(http.post(path, content=body, headers={"Content-Type": content_type}).status_code)
    docs = ["/docs", "/openapi.json", "/docs/assets/swagger-ui.css", "/docs/assets/..%2F..%2Fetc%2Fpasswd",
            "/docs/assets/%00", "/docs/assets/" + "a" * 5000]
    with httpx.Client(base_url=url, timeout=60) as anonymous:  # the docs: no, wrong and right Basic credentials
        for path in docs:
            for credentials in (None, ("", "wrong-token"), ("", TOKEN), (TOKEN, "")):
                statuses.append(anonymous.get(path, auth=credentials).status_code)
    slow = [_sock(url) for _ in range(200)]  # slow headers
    for i, sock in enumerate(slow):
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" if i % 2 else
                     f"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Length: 100000\r\n\r\n{".encode())
    for _ in range(3):
        time.sleep(1.0)
        for sock in slow:
            try:
                sock.sendall(b"x")
            except OSError:
                pass
    for sock in slow:
        sock.close()
    for _ in range(100):  # clients that leave mid-body
        sock = _sock(url)
        sock.sendall(f"POST /v1/chunks/put HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Length: 1000000\r\n\r\n".encode() + b"\0" * 10_000)
        sock.close()


def hostile(examples: int, root: Path) -> tuple[list[Record], dict[str, object]]:
    from service.process import Daemon, write_config

    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", chunk_tokens=16)
    tenants = [{"name": "a", "token": TOKEN, "salt": "hostile-a", "shm": True}]
    config = write_config(root, layout=layout, host_chunks=64, tenants=tenants,
                          service={"max_body_bytes": 1 << 20, "max_batch_chunks": 64, "lease_s": 1.0,
                                   "header_timeout_s": 2.0, "body_timeout_s": 2.0})
    daemon = Daemon(config, root / "daemon.log").start()
    poller = HealthPoller(daemon.url)
    statuses: list[int] = []
    idle = HealthPoller(daemon.url)
    try:
        idle.start()
        time.sleep(3.0)
        idle.stop()
        poller.start()
        _fuzz(daemon.url, examples, statuses)
        _hand_written(daemon.url, statuses)
        time.sleep(2.5)
    finally:
        poller.stop()
        daemon.close()
    lat = sorted(poller.samples)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    n5xx = sum(s >= 500 for s in statuses)
    records = [record("5xx answers", n5xx, "answers", "none", 0.0, ratio=float(n5xx)),
               record("requests sent (fuzz + hand-written)", len(statuses), "requests", "-", 1.0),
               record("/healthz p50 idle (same daemon, same machine)", statistics.median(idle.samples), "ms",
                      "100 ms target", HEALTHZ_TARGET_MS),
               record("/healthz p50 under attack", statistics.median(lat), "ms", "100 ms target", HEALTHZ_TARGET_MS),
               record("/healthz p99 under attack", p99, "ms", "100 ms target", HEALTHZ_TARGET_MS),
               record("/healthz max under attack", lat[-1], "ms", "100 ms target", HEALTHZ_TARGET_MS)]
    detail = {"statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}, "healthz_samples": len(lat),
              "healthz_failures": sum(x == float("inf") for x in lat)}
    return records, detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_extra(("schemathesis", "hypothesis"), extra="test", what="python -m bench.hostile")
    with tempfile.TemporaryDirectory(prefix="kvstore-hostile-") as tmp:
        records, detail = hostile(args.examples, Path(tmp))
    print_records("hostile load: fuzz + hand-written bodies + slow sockets", records)
    print(json.dumps(detail, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "records": records, "detail": detail}, indent=1))


if __name__ == "__main__":
    main()
