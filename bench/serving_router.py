"""The router `kvstore bench serving` puts in front of `vllm serve` replicas: it spreads requests, not sessions.

    replicas = ReplicaSet([a.url, b.url], policy="round_robin")
    with Router(replicas).start() as router:     # an asyncio proxy on uvicorn in a thread, on a free port
        drive(router.url, sessions, ...)         # POST /v1/completions goes to replicas.acquire()'s pick

Round robin sends each request to the next replica in turn, least loaded to the one with the fewest requests in
flight (ties in turn): neither keeps a session on one replica, so the turns of one session land on either, as with
a router that knows nothing of KV. A rolling restart drains a replica (no new requests), waits for its requests in
flight, and puts the restarted server's URL in its place (`replace`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from kvstore.errors import ConfigError
from service.process import free_port

POLICIES = ("round_robin", "least_loaded")


class ReplicaSet:
    """The replicas' URLs, which ones take requests, and how many each has in flight. Thread-safe: the router's
    loop acquires and releases, the bench's thread drains and replaces."""

    def __init__(self, urls: Sequence[str], policy: str = "round_robin") -> None:
        """Raises:
            ConfigError: no URL, a URL twice, or an unknown policy (the valid ones in the message).
        """
        if policy not in POLICIES:
            raise ConfigError(f"unknown router policy {policy!r}; use one of {', '.join(POLICIES)}")
        if not urls or len(set(urls)) != len(urls):
            raise ConfigError(f"a router needs distinct replica URLs, got {list(urls)}")
        self.policy = policy
        self._lock = threading.Lock()
        self._urls = list(urls)
        self._draining: set[str] = set()
        self._in_flight = dict.fromkeys(urls, 0)
        self._turn = 0
        self.num_done = 0  # requests answered (or failed) so far, all replicas
        self.num_served: dict[str, int] = dict.fromkeys(urls, 0)  # requests each URL took

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)

    def acquire(self) -> str:
        """The replica for the next request (counted in flight until `release`).

        Raises:
            RuntimeError: every replica is draining.
        """
        with self._lock:
            open_urls = [u for u in self._urls if u not in self._draining]
            if not open_urls:
                raise RuntimeError(f"every replica is draining: {self._urls}")
            rotated = [open_urls[(self._turn + i) % len(open_urls)] for i in range(len(open_urls))]
            self._turn += 1
            url = min(rotated, key=self._in_flight.__getitem__) if self.policy == "least_loaded" else rotated[0]
            self._in_flight[url] += 1
            self.num_served[url] += 1
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self._in_flight[url] -= 1
            self.num_done += 1

    def in_flight(self, url: str) -> int:
        with self._lock:
            return self._in_flight[url]

    def drain(self, url: str) -> None:
        """Send `url` no new requests (those in flight finish)."""
        with self._lock:
            if url not in self._in_flight:
                raise ConfigError(f"{url} is not a replica of this router: {self._urls}")
            self._draining.add(url)

    def wait_drained(self, url: str, timeout_s: float) -> None:
        """Block until `url` has nothing in flight.

        Raises:
            TimeoutError: it still has requests after timeout_s.
        """
        deadline = time.monotonic() + timeout_s
        while self.in_flight(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.in_flight(url):
            raise TimeoutError(f"replica {url} still has {self.in_flight(url)} requests after {timeout_s:g} s")

    def replace(self, old: str, new: str) -> None:
        """`new` takes `old`'s place in the rotation and takes requests."""
        with self._lock:
            if self._in_flight.get(old):
                raise RuntimeError(f"replica {old} still has {self._in_flight[old]} requests in flight; drain it first")
            self._urls[self._urls.index(old)] = new
            self._draining.discard(old)
            del self._in_flight[old]
            self._in_flight[new] = 0
            self.num_served[new] = 0


def make_app(replicas: ReplicaSet) -> Starlette:
    """POST /v1/completions to the replica `replicas` picks, streamed back as it comes; GET /health."""
    client: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        nonlocal client
        async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=httpx.Limits(max_connections=256)) as c:
            client = c
            yield

    async def completions(request: Request) -> Response:
        assert client is not None
        body = await request.body()
        try:
            url = replicas.acquire()
        except RuntimeError as exc:
            return PlainTextResponse(str(exc), status_code=503)
        try:
            upstream = await client.send(client.build_request(
                "POST", f"{url}/v1/completions", content=body, headers={"Content-Type": "application/json"}),
                stream=True)
        except httpx.HTTPError as exc:
            replicas.release(url)
            return PlainTextResponse(f"replica {url} failed: {exc!r}", status_code=502)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                replicas.release(url)

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/health", health, methods=["GET"])], lifespan=lifespan)


class Router:
    """The router's app on uvicorn in a thread of this process, on a free port of 127.0.0.1."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(make_app(replicas), host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True,
                                        name="serving-router")

    def start(self, timeout_s: float = 60.0) -> Router:
        """Raises:
            RuntimeError: uvicorn did not start in time.
        """
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started and time.monotonic() < deadline:
            if not self._thread.is_alive():
                break
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the serving router did not start on port {self.port} in {timeout_s:g} s")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> Router:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
